"""A pinned PyPI sdist (relevo_local.pypi_sdist): read only when its bytes are the pinned ones,
unpacked whole or not at all, never out of its directory."""

from __future__ import annotations

import hashlib
import io
import tarfile

import pytest

from relevo_local.pypi_sdist import PinnedSdist


def _sdist(tmp_path, members: dict[str, bytes], links: dict[str, str] | None = None) -> tuple[str, str]:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as archive:
        for name, content in members.items():
            member = tarfile.TarInfo(name)
            member.size = len(content)
            archive.addfile(member, io.BytesIO(content))
        for name, target in (links or {}).items():
            link = tarfile.TarInfo(name)
            link.type, link.linkname = tarfile.SYMTYPE, target
            archive.addfile(link)
    path = tmp_path / "sdist.tar.gz"
    path.write_bytes(data.getvalue())
    return path.as_uri(), hashlib.sha256(data.getvalue()).hexdigest()


def test_the_pinned_sdist_is_unpacked_once_under_its_top_directory(tmp_path):
    # Given an sdist and its sha256
    url, sha = _sdist(tmp_path, {"acme_lib-1.0/tests/test_a.py": b"def test_a(): pass\n"})
    pinned = PinnedSdist("acme-lib", "1.0", url, sha)

    # When it is unpacked
    unpacked = pinned.unpacked(tmp_path / "share")

    # Then its tree is there, nothing partial is left, and a second call fetches nothing
    assert (unpacked / "tests" / "test_a.py").read_bytes() == b"def test_a(): pass\n"
    assert [p.name for p in (tmp_path / "share").iterdir()] == ["acme_lib-1.0"]
    (tmp_path / "sdist.tar.gz").unlink()
    assert pinned.unpacked(tmp_path / "share") == unpacked


def test_an_sdist_that_is_not_the_pinned_one_is_refused_before_it_is_read(tmp_path):
    # Given an sdist whose bytes changed after it was pinned
    url, sha = _sdist(tmp_path, {"acme_lib-1.0/a.py": b""})
    _sdist(tmp_path, {"acme_lib-1.0/a.py": b"import os; os.system('evil')"})

    # When it is unpacked, then it is refused naming the pin, and nothing is written
    with pytest.raises(SystemExit, match=f"is not the pinned {sha}"):
        PinnedSdist("acme-lib", "1.0", url, sha).unpacked(tmp_path / "share")
    assert not (tmp_path / "share").exists()


def test_a_member_that_leads_out_of_the_tree_is_refused_and_nothing_is_left(tmp_path):
    # Given a pinned sdist holding a link out of its directory
    url, sha = _sdist(tmp_path, {"acme_lib-1.0/a.py": b""}, links={"acme_lib-1.0/out": "/etc/passwd"})

    # When it is unpacked, then tarfile's data filter refuses it, and no tree is left half-written
    with pytest.raises(tarfile.FilterError):
        PinnedSdist("acme-lib", "1.0", url, sha).unpacked(tmp_path / "share")
    assert list((tmp_path / "share").iterdir()) == []
