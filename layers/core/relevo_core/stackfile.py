"""How every tool finds a Relevo stack: a stack.json written by `relevo local up` (or by hand
for a deployed stack), or AWS_ENDPOINT_URL plus explicit names."""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict

DEFAULT_STATE_DIR = Path(".relevo/local")
STACK_FILE_ENV = "RELEVO_STACK_FILE"
# Where `relevo stack use` writes the deployed stack the CLI uses when no local stack is up here.
USER_STACK_FILE_ENV = "RELEVO_USER_STACK_FILE"


class LocalCredentials(BaseModel):
    """The access key of the emulator's IAM user that a local stack gives its tools (CLI, tests,
    demo, agents). It exists only inside that emulator, which refuses keys IAM never issued."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    access_key_id: str
    secret_access_key: str
    session_token: str | None = None


class StackInfo(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    stack_name: str = "relevo"
    aws_endpoint: str | None = None
    api_url: str
    region: str
    resources: dict[str, str | None]
    work_queues: dict[str, str]
    not_emulated: dict[str, str] = {}
    # Region affinity -> the role its Macs assume (template outputs AgentRoleArn...).
    agent_roles: dict[str, str] = {}
    # The AWS profile `relevo stack use --profile` read the stack with, used again by the tools.
    aws_profile: str | None = None
    # Local stacks only: the credentials to call it with (see LocalCredentials), and the ones its
    # agents use, per region affinity: sessions of that region's agent role, nothing more.
    local_credentials: LocalCredentials | None = None
    agent_credentials: dict[str, LocalCredentials] = {}

    @property
    def table_name(self) -> str:
        return str(self.resources["Table"])

    @property
    def state_machine_arn(self) -> str:
        return str(self.resources["JobStateMachine"])

    def _credentials(self, agent_region: str | None) -> LocalCredentials | None:
        if agent_region is not None and agent_region in self.agent_credentials:
            return self.agent_credentials[agent_region]
        return self.local_credentials

    def environment(self, agent_region: str | None = None) -> dict[str, str]:
        """The variables that point boto3 at this stack: its endpoint and region and, for a local
        stack, the credentials it issued (its emulator refuses any other key, and this machine's
        real AWS credentials must never be sent to it); an agent's of `agent_region`, if given."""
        env = {"AWS_DEFAULT_REGION": self.region, "AWS_REGION": self.region}
        if self.aws_endpoint:
            env["AWS_ENDPOINT_URL"] = self.aws_endpoint
        credentials = self._credentials(agent_region)
        if credentials is not None:
            env["AWS_ACCESS_KEY_ID"] = credentials.access_key_id
            env["AWS_SECRET_ACCESS_KEY"] = credentials.secret_access_key
            if credentials.session_token:
                env["AWS_SESSION_TOKEN"] = credentials.session_token
        return env

    def apply_to_environment(self, agent_region: str | None = None) -> None:
        """Point boto3 in this process at the stack (see `environment`). A deployed stack's
        region is only a default: the caller's own AWS settings decide."""
        env = self.environment(agent_region)
        if self._credentials(agent_region) is not None:
            for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
                os.environ.pop(name, None)
            os.environ.update(env)
            return
        if self.aws_endpoint:
            os.environ["AWS_ENDPOINT_URL"] = self.aws_endpoint
        if self.aws_profile and not os.environ.get("AWS_ACCESS_KEY_ID"):
            os.environ.setdefault("AWS_PROFILE", self.aws_profile)
        os.environ.setdefault("AWS_DEFAULT_REGION", self.region)
        os.environ.setdefault("AWS_REGION", self.region)


def user_stack_file() -> Path:
    if os.environ.get(USER_STACK_FILE_ENV):
        return Path(os.environ[USER_STACK_FILE_ENV])
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "relevo" / "stack.json"


def stack_file_in_use(path: str | os.PathLike[str] | None = None) -> tuple[Path, str]:
    """Which stack file a tool uses, and why: the one it is given, RELEVO_STACK_FILE, a local
    stack's in this directory, else the deployed stack `relevo stack use` chose."""
    if path:
        return Path(path), "--stack-file"
    if os.environ.get(STACK_FILE_ENV):
        return Path(os.environ[STACK_FILE_ENV]), STACK_FILE_ENV
    local = DEFAULT_STATE_DIR / "stack.json"
    if local.is_file() or not user_stack_file().is_file():
        return local, "the local stack of this directory (relevo local up)"
    return user_stack_file(), "relevo stack use"


def load_stack(path: str | os.PathLike[str] | None = None) -> StackInfo:
    candidate, _ = stack_file_in_use(path)
    if not candidate.is_file():
        raise FileNotFoundError(
            f"no stack file at {candidate}: start one with `relevo local up`, choose a deployed stack with "
            f"`relevo stack use NAME`, or set {STACK_FILE_ENV}"
        )
    return StackInfo.model_validate(json.loads(candidate.read_text()))
