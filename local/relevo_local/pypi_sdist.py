"""A source distribution fetched from PyPI, pinned by version and sha256 as npm packages are pinned
by integrity (relevo_local.npm_package): the archive's sha256 checked against the pin (the
`#sha256=` of its link on https://pypi.org/simple/<name>/) before anything in it is read, then
unpacked into the venv's share/ whole or not at all. A peer project's test suite comes this way
(relevo_local.peer_suite)."""

from __future__ import annotations

import hashlib
import io
import shutil
import tarfile
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from relevo_local.npm_package import VENV_SHARE


@dataclass(frozen=True)
class PinnedSdist:
    name: str
    version: str
    url: str
    sha256: str

    @property
    def top(self) -> str:
        """The archive's top directory (PEP 625: `<normalized name>-<version>`)."""
        return f"{self.name.replace('-', '_')}-{self.version}"

    def checked_bytes(self) -> bytes:
        with urllib.request.urlopen(self.url, timeout=120) as response:  # noqa: S310 (a pinned https URL)
            data = cast(bytes, response.read())
        actual = hashlib.sha256(data).hexdigest()
        if actual != self.sha256:
            raise SystemExit(f"{self.url}: sha256 {actual} is not the pinned {self.sha256}")
        return data

    def unpacked(self, share: Path = VENV_SHARE) -> Path:
        """The archive's top directory unpacked under `share` (once: a later call finds it)."""
        target = share / self.top
        if target.is_dir():
            return target
        data = self.checked_bytes()
        share.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=share, prefix=f".{self.top}.") as partial:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
                # The "data" filter refuses absolute paths, links out of the tree and device files.
                archive.extractall(partial, filter="data")
            unpacked = Path(partial) / self.top
            if not unpacked.is_dir():
                raise SystemExit(f"{self.url} holds no {self.top}/")
            try:
                unpacked.rename(target)
            except OSError:
                if not target.is_dir():  # not another process that unpacked it first
                    raise
                shutil.rmtree(unpacked)
        return target
