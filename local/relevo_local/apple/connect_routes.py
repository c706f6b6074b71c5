"""App Store Connect's endpoints that a release needs, answered from connect_state: the app, its
build uploads (filtered by version, build number, platform and state), the upload's files and
their commit, and the builds processing makes (filtered by app, build number, version and
processingState). Each returns (status, document); a refusal raises ConnectError."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from relevo_local.apple.connect_render import (
    app_resource,
    build_resource,
    collection,
    file_resource,
    upload_resource,
)
from relevo_local.apple.connect_state import Build, BuildUpload, ConnectError, ConnectState, not_found

Answer = tuple[int, dict[str, Any]]


@dataclass(frozen=True)
class Call:
    base: str
    path: str
    ids: tuple[str, ...]
    query: dict[str, str]
    body: Any

    def listed(self, name: str) -> list[str] | None:
        value = self.query.get(name)
        return None if value is None else value.split(",")

    def limit(self) -> int:
        return int(self.query.get("limit", "50"))


def _matches(wanted: list[str] | None, value: str) -> bool:
    return wanted is None or value in wanted


def list_apps(state: ConnectState, call: Call) -> Answer:
    apps = [a for a in state.apps.values() if _matches(call.listed("filter[bundleId]"), a.bundle_id)]
    data = [app_resource(call.base, a) for a in apps[: call.limit()]]
    return 200, collection(call.base + call.path, data, call.limit(), len(apps))


def get_app(state: ConnectState, call: Call) -> Answer:
    app = state.app(call.ids[0])
    return 200, {"data": app_resource(call.base, app), "links": {"self": call.base + call.path}}


def _upload_document(state: ConnectState, call: Call, upload: BuildUpload) -> dict[str, Any]:
    return {"data": upload_resource(call.base, state, upload), "links": {"self": call.base + call.path}}


def list_app_uploads(state: ConnectState, call: Call) -> Answer:
    uploads = [
        u
        for u in state.uploads_of(call.ids[0])
        if _matches(call.listed("filter[cfBundleShortVersionString]"), u.short_version)
        and _matches(call.listed("filter[cfBundleVersion]"), u.version)
        and _matches(call.listed("filter[platform]"), u.platform)
        and _matches(call.listed("filter[state]"), state.upload_state(u))
    ]
    uploads.sort(key=lambda u: u.created, reverse=True)
    data = [upload_resource(call.base, state, u) for u in uploads[: call.limit()]]
    document = collection(call.base + call.path, data, call.limit(), len(uploads))
    included = call.listed("include") or []
    if "assetFile" in included:
        document["included"] = [
            file_resource(call.base, state.files[u.file_ids[0]])
            for u in uploads[: call.limit()]
            if u.file_ids
        ]
    return 200, document


def create_upload(state: ConnectState, call: Call) -> Answer:
    data = call.body["data"]
    attributes = data["attributes"]
    upload = state.create_upload(
        data["relationships"]["app"]["data"]["id"],
        attributes["cfBundleShortVersionString"],
        attributes["cfBundleVersion"],
        attributes["platform"],
    )
    return 201, {"data": upload_resource(call.base, state, upload), "links": {"self": call.base + call.path}}


def get_upload(state: ConnectState, call: Call) -> Answer:
    return 200, _upload_document(state, call, state.upload(call.ids[0]))


def list_upload_files(state: ConnectState, call: Call) -> Answer:
    upload = state.upload(call.ids[0])
    data = [file_resource(call.base, state.files[f]) for f in upload.file_ids]
    return 200, collection(call.base + call.path, data, call.limit(), len(data))


def create_file(state: ConnectState, call: Call) -> Answer:
    data = call.body["data"]
    attributes = data["attributes"]
    upload_file = state.create_file(
        data["relationships"]["buildUpload"]["data"]["id"],
        attributes["fileName"],
        attributes["fileSize"],
        attributes["uti"],
        attributes["assetType"],
    )
    return 201, {"data": file_resource(call.base, upload_file), "links": {"self": call.base + call.path}}


def get_file(state: ConnectState, call: Call) -> Answer:
    upload_file = state.file(call.ids[0])
    return 200, {"data": file_resource(call.base, upload_file), "links": {"self": call.base + call.path}}


def update_file(state: ConnectState, call: Call) -> Answer:
    data = call.body["data"]
    if data["id"] != call.ids[0]:
        raise ConnectError(
            409,
            "ENTITY_ERROR.ATTRIBUTE.INVALID",
            "The provided entity includes an attribute with an invalid value",
            "The id in the body is not the id in the URL.",
            "/data/id",
        )
    attributes = data.get("attributes") or {}
    upload_file = state.file(call.ids[0])
    if attributes.get("uploaded"):
        checksum = (attributes.get("sourceFileChecksums") or {}).get("file") or {}
        sha256 = checksum.get("hash") if checksum.get("algorithm") == "SHA_256" else None
        upload_file = state.commit_file(upload_file.id, sha256)
    return 200, {"data": file_resource(call.base, upload_file), "links": {"self": call.base + call.path}}


def _build_matches(state: ConnectState, call: Call, build: Build) -> bool:
    return (
        _matches(call.listed("filter[app]"), build.app_id)
        and _matches(call.listed("filter[version]"), build.version)
        and _matches(call.listed("filter[preReleaseVersion.version]"), build.short_version)
        and _matches(call.listed("filter[processingState]"), state.processing_state(build))
        and _matches(call.listed("filter[id]"), build.id)
    )


def list_builds(state: ConnectState, call: Call) -> Answer:
    with state.lock:
        state.advance()
        builds = [b for b in state.builds.values() if _build_matches(state, call, b)]
    builds.sort(key=lambda b: b.uploaded, reverse=True)
    data = [build_resource(call.base, state, b) for b in builds[: call.limit()]]
    return 200, collection(call.base + call.path, data, call.limit(), len(builds))


def get_build(state: ConnectState, call: Call) -> Answer:
    with state.lock:
        state.advance()
        build = state.builds.get(call.ids[0])
    if build is None:
        raise not_found("builds", call.ids[0])
    return 200, {"data": build_resource(call.base, state, build), "links": {"self": call.base + call.path}}


_ID = r"([^/]+)"
ROUTES: list[tuple[str, re.Pattern[str], Callable[[ConnectState, Call], Answer]]] = [
    (method, re.compile(f"^{pattern}$"), handler)
    for method, pattern, handler in [
        ("GET", "/v1/apps", list_apps),
        ("GET", f"/v1/apps/{_ID}", get_app),
        ("GET", f"/v1/apps/{_ID}/buildUploads", list_app_uploads),
        ("POST", "/v1/buildUploads", create_upload),
        ("GET", f"/v1/buildUploads/{_ID}", get_upload),
        ("GET", f"/v1/buildUploads/{_ID}/buildUploadFiles", list_upload_files),
        ("POST", "/v1/buildUploadFiles", create_file),
        ("GET", f"/v1/buildUploadFiles/{_ID}", get_file),
        ("PATCH", f"/v1/buildUploadFiles/{_ID}", update_file),
        ("GET", "/v1/builds", list_builds),
        ("GET", f"/v1/builds/{_ID}", get_build),
    ]
]


def answer(state: ConnectState, method: str, call: Call) -> Answer:
    for route_method, pattern, handler in ROUTES:
        found = pattern.match(call.path)
        if found and route_method == method:
            return handler(state, Call(call.base, call.path, found.groups(), call.query, call.body))
    raise ConnectError(
        404,
        "NOT_FOUND",
        "The specified resource does not exist",
        f"The path provided does not match a defined resource type ({method} {call.path}).",
    )
