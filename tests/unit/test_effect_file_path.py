"""A release effect's file (relevo_core.models.effect, issue 44): a path in the workspace, refused
when absolute or when it climbs out with `..` -- the declaration must compile its pattern at all."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from relevo_core.models.effect import AppStoreUpload

SECRET = "relevo/dev/_release/app/asc-key"


def _upload(file: str) -> AppStoreUpload:
    return AppStoreUpload.model_validate(
        {"kind": "app_store_upload", "file": file, "app_id": "1234567890", "api_key": SECRET}
    )


@pytest.mark.parametrize("file", ["build/App.ipa", "App.ipa", "out/..hidden/App.ipa"])
def test_a_path_in_the_workspace_is_taken(file):
    # When the declaration names a file in the workspace, then it is that file
    assert _upload(file).file == file


@pytest.mark.parametrize("file", ["/tmp/App.ipa", "../App.ipa", "build/../../App.ipa", "build/.."])
def test_a_path_out_of_the_workspace_is_refused(file):
    # When it names an absolute path or climbs out, then the declaration is refused on its file
    with pytest.raises(ValidationError) as refused:
        _upload(file)
    assert refused.value.errors()[0]["loc"] == ("file",)
