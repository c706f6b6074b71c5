"""How every tool finds a Relevo stack: a stack.json written by `relevo local up` (or by hand
for a deployed stack), or AWS_ENDPOINT_URL plus explicit names."""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict

DEFAULT_STATE_DIR = Path(".relevo/local")
STACK_FILE_ENV = "RELEVO_STACK_FILE"


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
    # Local stacks only: the credentials to call it with (see LocalCredentials).
    local_credentials: LocalCredentials | None = None

    @property
    def table_name(self) -> str:
        return str(self.resources["Table"])

    @property
    def state_machine_arn(self) -> str:
        return str(self.resources["JobStateMachine"])

    def environment(self) -> dict[str, str]:
        """The variables that point boto3 at this stack: its endpoint and region and, for a local
        stack, the credentials it issued (its emulator refuses any other key, and this machine's
        real AWS credentials must never be sent to it)."""
        env = {"AWS_DEFAULT_REGION": self.region, "AWS_REGION": self.region}
        if self.aws_endpoint:
            env["AWS_ENDPOINT_URL"] = self.aws_endpoint
        if self.local_credentials is not None:
            env["AWS_ACCESS_KEY_ID"] = self.local_credentials.access_key_id
            env["AWS_SECRET_ACCESS_KEY"] = self.local_credentials.secret_access_key
            if self.local_credentials.session_token:
                env["AWS_SESSION_TOKEN"] = self.local_credentials.session_token
        return env

    def apply_to_environment(self) -> None:
        """Point boto3 in this process at the stack (see `environment`). A deployed stack's
        region is only a default: the caller's own AWS settings decide."""
        env = self.environment()
        if self.local_credentials is not None:
            for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
                os.environ.pop(name, None)
            os.environ.update(env)
            return
        if self.aws_endpoint:
            os.environ["AWS_ENDPOINT_URL"] = self.aws_endpoint
        os.environ.setdefault("AWS_DEFAULT_REGION", self.region)
        os.environ.setdefault("AWS_REGION", self.region)


def load_stack(path: str | os.PathLike[str] | None = None) -> StackInfo:
    candidate = Path(path or os.environ.get(STACK_FILE_ENV) or DEFAULT_STATE_DIR / "stack.json")
    if not candidate.is_file():
        raise FileNotFoundError(
            f"no stack file at {candidate}: start one with `relevo local up` or set {STACK_FILE_ENV}"
        )
    return StackInfo.model_validate(json.loads(candidate.read_text()))
