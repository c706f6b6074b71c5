"""What an app_store_upload sends, read from the file itself before anything is asked of Apple: its
version (CFBundleShortVersionString) and build number (CFBundleVersion) -- an .ipa's from its
Payload/<name>.app/Info.plist (XML or binary plist), a .pkg's from the declaration -- and its
SHA-256. A file that cannot be read, or that disagrees with the declaration, is EFFECT_REFUSED
naming what is wrong."""

from __future__ import annotations

import hashlib
import plistlib
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

from relevo_agent.effects.kind import EffectFailed
from relevo_core.models.effect import AppStoreUpload
from relevo_core.models.errors import ErrorClass

INFO_PLIST = re.compile(r"^Payload/[^/]+\.app/Info\.plist$")
# App Store Connect's form of both: up to three dot-separated integers.
NUMBER = re.compile(r"^[0-9]+(\.[0-9]+){0,2}$")
# An Info.plist is a few KB: a bigger one is not read (a zip's declared sizes can lie).
MAX_PLIST_BYTES = 1 << 20
UTI = {".ipa": "com.apple.ipa", ".pkg": "com.apple.pkg"}


@dataclass(frozen=True)
class Binary:
    path: Path
    version: str
    build: str
    sha256: str
    size: int
    uti: str


def _refused(message: str) -> EffectFailed:
    return EffectFailed(ErrorClass.EFFECT_REFUSED, message)


def _info_plist(path: Path) -> dict[str, object]:
    try:
        with zipfile.ZipFile(path) as archive:
            names = [info for info in archive.infolist() if INFO_PLIST.match(info.filename)]
            if len(names) != 1:
                found = "no" if not names else f"{len(names)}"
                raise _refused(f"{path.name} holds {found} Payload/<name>.app/Info.plist: it is not an .ipa")
            if names[0].file_size > MAX_PLIST_BYTES:
                raise _refused(f"{path.name}: {names[0].filename} is over {MAX_PLIST_BYTES} bytes")
            with archive.open(names[0]) as member:
                data = member.read(MAX_PLIST_BYTES + 1)
    # zipfile raises NotImplementedError for a compression method it lacks: still not a readable .ipa.
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, NotImplementedError) as error:
        raise _refused(f"{path.name} is not a readable .ipa (a zip archive): {error}") from None
    try:
        info = plistlib.loads(data)
    except (plistlib.InvalidFileException, ValueError, OverflowError) as error:
        raise _refused(f"{path.name}: {names[0].filename} is not a property list ({error})") from None
    if not isinstance(info, dict):
        raise _refused(f"{path.name}: {names[0].filename} is not a dictionary")
    return info


def _number(info: dict[str, object], key: str, name: str) -> str:
    value = info.get(key)
    if not isinstance(value, str) or not NUMBER.match(value):
        shown = "missing" if value is None else repr(value)[:40]
        raise _refused(
            f"{name}'s Info.plist {key} is {shown}: App Store Connect takes 1 to 3 dot-separated integers"
        )
    return value


def _sha256(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as source:
        while chunk := source.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def read_binary(spec: AppStoreUpload, path: Path) -> Binary:
    suffix = path.suffix.lower()
    if suffix not in UTI:
        raise _refused(f"{path.name} is neither an .ipa nor a .pkg")
    if not path.is_file():
        raise _refused(f"{spec.file} is not a file in the workspace")
    if suffix == ".ipa":
        info = _info_plist(path)
        version = _number(info, "CFBundleShortVersionString", path.name)
        build = _number(info, "CFBundleVersion", path.name)
        for declared, read, key in ((spec.version, version, "version"), (spec.build, build, "build")):
            if declared is not None and declared != read:
                raise _refused(
                    f"the declared {key} {declared} is not the .ipa's {read} ({path.name}'s Info.plist)"
                )
    else:
        if spec.version is None or spec.build is None:
            raise _refused(f"{path.name} is a .pkg: declare its version and build in the effect")
        version, build = spec.version, spec.build
    sha256, size = _sha256(path)
    if size == 0:
        raise _refused(f"{path.name} is empty")
    return Binary(path, version, build, sha256, size, UTI[suffix])
