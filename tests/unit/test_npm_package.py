"""A pinned npm tarball (relevo_local.npm_package): read only when its bytes are the pinned ones."""

from __future__ import annotations

import base64
import hashlib
import io
import tarfile

import pytest

from relevo_local.npm_package import PinnedPackage, write_whole


def _tarball(tmp_path, content: bytes) -> tuple[str, str]:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as archive:
        member = tarfile.TarInfo("package/api.json")
        member.size = len(content)
        archive.addfile(member, io.BytesIO(content))
    path = tmp_path / "package.tgz"
    path.write_bytes(data.getvalue())
    return path.as_uri(), "sha512-" + base64.b64encode(hashlib.sha512(data.getvalue()).digest()).decode()


def test_the_pinned_tarballs_member_is_read_and_written_whole(tmp_path):
    # Given a tarball and its integrity
    url, integrity = _tarball(tmp_path, b'{"openapi": "3.0.3"}')

    # When its member is taken and written
    (content,) = PinnedPackage("@acme/api", "1.0.0", url, integrity).members(["package/api.json"])
    written = write_whole(tmp_path / "cache" / "api.json", content)

    # Then the bytes are the member's, and no partial file is left
    assert written.read_bytes() == b'{"openapi": "3.0.3"}'
    assert [p.name for p in written.parent.iterdir()] == ["api.json"]


def test_a_tarball_that_is_not_the_pinned_one_is_refused_before_it_is_read(tmp_path):
    # Given a tarball whose bytes changed after it was pinned
    url, integrity = _tarball(tmp_path, b'{"openapi": "3.0.3"}')
    _tarball(tmp_path, b'{"openapi": "3.0.3", "paths": {"/evil": {}}}')

    # When it is read, then it is refused naming the pin
    with pytest.raises(SystemExit, match="is not the pinned sha512-"):
        PinnedPackage("@acme/api", "1.0.0", url, integrity).members(["package/api.json"])


def test_a_member_the_tarball_does_not_hold_is_named(tmp_path):
    url, integrity = _tarball(tmp_path, b"{}")
    with pytest.raises(SystemExit, match="holds no package/other.json"):
        PinnedPackage("@acme/api", "1.0.0", url, integrity).members(["package/other.json"])
