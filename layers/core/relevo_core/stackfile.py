"""How every tool finds a Relevo stack: a stack.json written by `relevo local up` (or by hand
for a deployed stack), or AWS_ENDPOINT_URL plus explicit names."""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict

DEFAULT_STATE_DIR = Path(".relevo/local")
STACK_FILE_ENV = "RELEVO_STACK_FILE"


class StackInfo(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    stack_name: str = "relevo"
    aws_endpoint: str | None = None
    api_url: str
    region: str
    resources: dict[str, str | None]
    work_queues: dict[str, str]
    not_emulated: dict[str, str] = {}

    @property
    def table_name(self) -> str:
        return str(self.resources["Table"])

    @property
    def state_machine_arn(self) -> str:
        return str(self.resources["JobStateMachine"])

    def apply_to_environment(self) -> None:
        """Point boto3 in this process at the stack (endpoint and region)."""
        if self.aws_endpoint:
            os.environ["AWS_ENDPOINT_URL"] = self.aws_endpoint
            # The embedded emulator accepts any credentials; a real stack needs the caller's own.
            os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
            os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
        os.environ.setdefault("AWS_DEFAULT_REGION", self.region)
        os.environ.setdefault("AWS_REGION", self.region)


def load_stack(path: str | os.PathLike[str] | None = None) -> StackInfo:
    candidate = Path(path or os.environ.get(STACK_FILE_ENV) or DEFAULT_STATE_DIR / "stack.json")
    if not candidate.is_file():
        raise FileNotFoundError(
            f"no stack file at {candidate}: start one with `relevo local up` or set {STACK_FILE_ENV}"
        )
    return StackInfo.model_validate(json.loads(candidate.read_text()))
