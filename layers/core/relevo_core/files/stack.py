"""How every tool finds a Relevo stack: a stack.json written by `relevo local up`, or by `relevo
stack use` / `relevo-agent init` from a deployed stack's CloudFormation outputs and resources (the
local stack is created through its emulator's CloudFormation, so it is found the same way)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from relevo_core.files.private import write_private

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
        """The machine of a job whose intake took its project's lock (statemachines/job_run.asl.json)."""
        return str(self.resources["JobStateMachine"])

    @property
    def queued_state_machine_arn(self) -> str:
        """The machine of a job that may wait for its project (statemachines/job.asl.json)."""
        return str(self.resources["JobQueuedStateMachine"])

    @property
    def machines(self) -> tuple[str, str]:
        """Where a job's execution may be, the common machine first (config.ExecutionSettings.machines)."""
        return (self.state_machine_arn, self.queued_state_machine_arn)

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


# A stack whose resources are all there and settled (CloudFormation's stack status values).
USABLE = {
    "CREATE_COMPLETE",
    "UPDATE_COMPLETE",
    "UPDATE_ROLLBACK_COMPLETE",
    "IMPORT_COMPLETE",
    "IMPORT_ROLLBACK_COMPLETE",
}
REQUIRED_OUTPUTS = ("ApiUrl", "TableName", "StateMachineArn", "ArtifactBucketName", "NotificationTopicArn")


class StackProblem(Exception):
    """The stack cannot be used, in words that say what to do."""


def _logical_suffix(region_affinity: str) -> str:
    """How Fn::ForEach's &{Region} turns an affinity into a logical-id suffix."""
    return re.sub(r"[^0-9a-zA-Z]+", "", region_affinity)


def read_stack(name: str, aws: Any, endpoint_url: str | None = None) -> StackInfo:
    """The stack file of the CloudFormation stack `name`, from its outputs and resources."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    cloudformation = aws.client("cloudformation", endpoint_url=endpoint_url)
    try:
        stacks = cloudformation.describe_stacks(StackName=name)["Stacks"]
    except NoCredentialsError as exc:
        raise StackProblem(
            "no AWS credentials: set AWS_PROFILE, pass --profile, or run `aws configure`"
        ) from exc
    except ClientError as exc:
        message = exc.response["Error"].get("Message", "")
        if "does not exist" in message:
            region = aws.region_name or "the default region"
            raise StackProblem(
                f"no stack named {name!r} in {region}: deploy it with `sam deploy --guided`, or pass --region"
            ) from exc
        raise StackProblem(
            f"cannot read stack {name!r}: {exc.response['Error'].get('Code')}: {message}"
        ) from exc
    except BotoCoreError as exc:
        raise StackProblem(f"cannot reach CloudFormation: {exc}") from exc
    stack = stacks[0]
    status = stack["StackStatus"]
    if status not in USABLE:
        hint = (
            "wait for it to finish"
            if status.endswith("_IN_PROGRESS")
            else "see its events in the CloudFormation console, fix, and deploy again"
        )
        raise StackProblem(f"stack {name!r} is {status}, not deployed: {hint}")
    outputs = {output["OutputKey"]: output["OutputValue"] for output in stack.get("Outputs", [])}
    missing = [key for key in REQUIRED_OUTPUTS if key not in outputs]
    if missing:
        raise StackProblem(
            f"stack {name!r} has no output {', '.join(missing)}: is it a Relevo stack, deployed from this "
            "version's template.yaml?"
        )
    resources: dict[str, str | None] = {}
    for page in cloudformation.get_paginator("list_stack_resources").paginate(StackName=name):
        for summary in page["StackResourceSummaries"]:
            resources[summary["LogicalResourceId"]] = summary.get("PhysicalResourceId")
    prefix = f"{name}-work-"
    work_queues = {}
    for logical_id, url in resources.items():
        queue = str(url or "").rsplit("/", 1)[-1]
        if logical_id.startswith("WorkQueue") and queue.startswith(prefix) and not queue.endswith("-dlq"):
            work_queues[queue.removeprefix(prefix)] = str(url)
    if not work_queues:
        raise StackProblem(f"stack {name!r} has no work queue: its RegionAffinities parameter is empty")
    agent_roles = {
        region: outputs[f"AgentRoleArn{_logical_suffix(region)}"]
        for region in work_queues
        if f"AgentRoleArn{_logical_suffix(region)}" in outputs
    }
    return StackInfo(
        stack_name=name,
        aws_endpoint=endpoint_url,
        api_url=outputs["ApiUrl"],
        region=aws.region_name or stack["StackId"].split(":")[3],
        resources=dict(sorted(resources.items())),
        work_queues=dict(sorted(work_queues.items())),
        agent_roles=agent_roles,
    )


def write_stack_file(info: StackInfo, path: Path) -> Path:
    return write_private(path, json.dumps(info.model_dump(exclude_none=True), indent=2) + "\n")
