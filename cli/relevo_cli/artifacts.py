"""`relevo artifact download`: download an artifact through its presigned link and check it against
the sha256 and size the agent recorded when it uploaded the file."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

import requests

_BLOCK = 1024 * 1024


class ChecksumMismatch(Exception):
    pass


def _umask() -> int:
    """The process's umask (reading it means setting it: set back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def download(link: dict[str, Any], destination: Path, timeout: float = 60) -> Path:
    """Stream the file at link["url"] into `destination` (a directory: the artifact's base name
    inside it). The bytes go to a temporary file beside it, which becomes `destination` only if
    their sha256 and size match the record; otherwise it is removed and ChecksumMismatch raised.
    The file gets the mode the user's umask gives a new file, as `curl -o` would write it."""
    if destination.is_dir():
        destination = destination / Path(link["name"]).name
    destination.parent.mkdir(parents=True, exist_ok=True)
    digest, size = hashlib.sha256(), 0
    fd, partial = tempfile.mkstemp(prefix=f".{destination.name}.", suffix=".part", dir=destination.parent)
    try:
        with os.fdopen(fd, "wb") as out, requests.get(link["url"], stream=True, timeout=timeout) as response:
            response.raise_for_status()
            for block in response.iter_content(_BLOCK):
                digest.update(block)
                size += len(block)
                out.write(block)
        if (digest.hexdigest(), size) != (link["sha256"], link["size"]):
            raise ChecksumMismatch(
                f"{link['name']}: downloaded {size} bytes with sha256 {digest.hexdigest()}, "
                f"recorded {link['size']} bytes with sha256 {link['sha256']}"
            )
        # mkstemp made it 0600; the file is the user's like any other they make: 0666 less the umask.
        os.chmod(partial, 0o666 & ~_umask())
        os.replace(partial, destination)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return destination
