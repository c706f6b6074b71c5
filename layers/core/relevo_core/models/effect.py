"""A stage's built-in release effect (`effect: {kind: …}`, docs/release-effects.md): what the
agent does itself instead of a command, exactly once. Each kind names the file it sends (a path in
the workspace, as an earlier stage handed it on) and where its API key lives in Secrets Manager
(relevo/<stack>/_release/<project>/…, read with the job's session only)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

# Where a project's release keys live in Secrets Manager: relevo/<stack>/_release/<project>/…
RELEASE_SECRET = r"^relevo/[A-Za-z0-9-]+/_release/[a-z0-9][a-z0-9-]{0,62}/[A-Za-z0-9/_+=.@-]+$"
# A workspace-relative path: no absolute path, no `..` (the file is the workspace's).
WORKSPACE_FILE = r"^(?!/)(?!.*(^|/)\.\.(/|$))[^\0]{1,1024}$"


class _Effect(BaseModel):
    # WORKSPACE_FILE looks ahead, which pydantic's default (Rust) regex engine cannot compile.
    model_config = ConfigDict(extra="forbid", frozen=True, regex_engine="python-re")

    file: str = Field(
        pattern=WORKSPACE_FILE,
        description="The file the effect sends, relative to the workspace (an earlier stage's handoff).",
    )


class AppStoreUpload(_Effect):
    """An .ipa or .pkg to App Store Connect through its Build Uploads API."""

    kind: Literal["app_store_upload"] = Field(description="app_store_upload")
    app_id: str = Field(pattern=r"^[0-9]{1,20}$", description="The app's App Store Connect id (Apple ID).")
    api_key: str = Field(
        pattern=RELEASE_SECRET,
        description="Secrets Manager name of the team key: a JSON object with key_id, issuer_id and "
        "private_key (the .p8's PEM text), under relevo/<stack>/_release/<project>/.",
    )
    platform: Literal["IOS", "MAC_OS", "TV_OS", "VISION_OS"] = Field(
        default="IOS", description="The build's platform at App Store Connect."
    )
    # A .pkg carries no Info.plist Relevo can read without macOS tools: its version and build number
    # are declared here (an .ipa's are read from its Info.plist, and must agree when declared).
    version: str | None = Field(
        default=None,
        pattern=r"^[0-9]+(\.[0-9]+){0,2}$",
        description="CFBundleShortVersionString: required for a .pkg; for an .ipa, read from its Info.plist.",
    )
    build: str | None = Field(
        default=None,
        pattern=r"^[0-9]+(\.[0-9]+){0,2}$",
        description="CFBundleVersion: required for a .pkg; for an .ipa, read from its Info.plist.",
    )
    wait_for_processing: bool = Field(
        default=True,
        description="Wait (within the stage's exec timeout) until Apple has processed the build: "
        "VALID succeeds the stage, FAILED fails it for good.",
    )


class Notarization(_Effect):
    """A .zip, .dmg or .pkg submitted to Apple's Notary API, waited for, then stapled."""

    kind: Literal["notarization"] = Field(description="notarization")
    api_key: str = Field(pattern=RELEASE_SECRET, description="As app_store_upload's api_key.")
    staple: bool = Field(
        default=True,
        description="Staple the ticket to the file once accepted (a .dmg or .pkg; a .zip cannot be stapled).",
    )


class GithubReleaseAsset(_Effect):
    """A file attached to a GitHub release, by tag and asset name."""

    kind: Literal["github_release_asset"] = Field(description="github_release_asset")
    repository: str = Field(
        pattern=r"^[A-Za-z0-9_.-]{1,100}/[A-Za-z0-9_.-]{1,100}$", description="owner/name on GitHub."
    )
    tag: str = Field(min_length=1, max_length=255, description="The release's tag.")
    name: str | None = Field(
        default=None, max_length=255, description="The asset's name; the file's by default."
    )
    token: str = Field(
        pattern=RELEASE_SECRET, description="Secrets Manager name of a token that may write releases."
    )


class S3Object(_Effect):
    """A file put at an S3 key (a download page's bucket, say), once, with its sha256."""

    kind: Literal["s3_object"] = Field(description="s3_object")
    bucket: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", description="The bucket.")
    key: str = Field(
        min_length=1, max_length=1024, description="The object's key: written once, never overwritten."
    )


Effect = Annotated[
    AppStoreUpload | Notarization | GithubReleaseAsset | S3Object,
    Field(discriminator="kind"),
]
