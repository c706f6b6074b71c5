"""A stage attempt's artifact transfer as the agent reports it (files and bytes done of the total,
the file under way) and as the job view, `relevo job view` and the console show it."""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field


def human_bytes(n: float) -> str:
    """`512 B`, `412.0 MiB`, `1.2 GiB`: binary units, one decimal."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


def uploaded_text(files: int, size: int) -> str:
    """`5 files, 1.2 GiB uploaded`."""
    return f"{files} file{'' if files == 1 else 's'}, {human_bytes(size)} uploaded"


class TransferState(str, Enum):
    UPLOADING = "uploading"
    UPLOADED = "uploaded"
    # The upload stopped on an error (the stage fails with its class): what got through before it.
    FAILED = "failed"


class TransferProgress(BaseModel):
    """One attempt's upload of its stage's artifacts, written on the stage record by the agent that
    holds the attempt (fenced on it) with its lease renewals, and once when the upload ends."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    attempt: int = Field(ge=1, description="the stage attempt that uploads")
    state: TransferState
    files_done: int = Field(ge=0, description="files uploaded, verified and recorded")
    files_total: int = Field(ge=0)
    bytes_done: int = Field(ge=0, description="bytes sent, of every file so far")
    bytes_total: int = Field(ge=0)
    current_file: str | None = Field(None, description="the file being sent, while uploading")
    updated_at: str = Field(description="when the agent took this reading (ISO 8601, UTC)")

    @property
    def percent(self) -> int:
        return int(100 * self.bytes_done / self.bytes_total) if self.bytes_total else 100

    def describe(self) -> str:
        """`uploading 3 of 5 files, 412.0 MiB of 1.2 GiB (34 %)`; `5 files, 1.2 GiB uploaded`."""
        if self.state is TransferState.UPLOADED:
            return uploaded_text(self.files_total, self.bytes_total)
        files = f"{self.files_total} file{'' if self.files_total == 1 else 's'}"
        moved = f"{human_bytes(self.bytes_done)} of {human_bytes(self.bytes_total)} ({self.percent} %)"
        if self.state is TransferState.FAILED:
            return f"upload failed after {self.files_done} of {files}, {moved}"
        return f"uploading {min(self.files_done + 1, self.files_total)} of {files}, {moved}"
