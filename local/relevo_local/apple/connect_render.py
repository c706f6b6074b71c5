"""App Store Connect's JSON:API documents for what connect_state keeps: each resource with the
attributes and relationships the description gives it, and the error document of a refusal."""

from __future__ import annotations

from typing import Any

from relevo_local.apple.clock import iso
from relevo_local.apple.connect_state import App, Build, BuildUpload, ConnectError, ConnectState, UploadFile

PART_BYTES = 5 * 1024 * 1024


def error_document(error: ConnectError) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "id": "00000000-0000-4000-8000-000000000000",
        "status": str(error.status),
        "code": error.code,
        "title": error.title,
        "detail": error.detail,
    }
    if error.pointer:
        entry["source"] = {"pointer": error.pointer}
    return {"errors": [entry]}


def app_resource(base: str, app: App) -> dict[str, Any]:
    attributes = {"name": app.name, "bundleId": app.bundle_id, "sku": app.sku, "primaryLocale": "en-US"}
    return {
        "type": "apps",
        "id": app.id,
        "attributes": attributes,
        "links": {"self": f"{base}/v1/apps/{app.id}"},
    }


def upload_resource(base: str, state: ConnectState, upload: BuildUpload) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "cfBundleShortVersionString": upload.short_version,
        "cfBundleVersion": upload.version,
        "createdDate": iso(upload.created),
        "platform": upload.platform,
        "state": {
            "state": state.upload_state(upload),
            "errors": [{"code": code, "description": text} for code, text in upload.errors],
            "warnings": [],
            "infos": [],
        },
    }
    if upload.committed_at is not None:
        attributes["uploadedDate"] = iso(upload.committed_at)
    self_link = f"{base}/v1/buildUploads/{upload.id}"
    relationships: dict[str, Any] = {
        "buildUploadFiles": {"links": {"related": f"{self_link}/buildUploadFiles"}}
    }
    if upload.file_ids:
        relationships["assetFile"] = {"data": {"type": "buildUploadFiles", "id": upload.file_ids[0]}}
    if upload.build_id is not None:
        relationships["build"] = {"data": {"type": "builds", "id": upload.build_id}}
    return {
        "type": "buildUploads",
        "id": upload.id,
        "attributes": attributes,
        "relationships": relationships,
        "links": {"self": self_link},
    }


def upload_operations(base: str, upload_file: UploadFile) -> list[dict[str, Any]]:
    """Where the bytes go, part by part (Apple's are presigned URLs; here the service's own PUT)."""
    operations = []
    for number, offset in enumerate(range(0, upload_file.file_size, PART_BYTES), start=1):
        length = min(PART_BYTES, upload_file.file_size - offset)
        operations.append(
            {
                "method": "PUT",
                "url": f"{base}/upload/{upload_file.id}?offset={offset}",
                "length": length,
                "offset": offset,
                "partNumber": number,
                "requestHeaders": [{"name": "Content-Type", "value": "application/octet-stream"}],
            }
        )
    return operations


def file_resource(base: str, upload_file: UploadFile) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "assetType": upload_file.asset_type,
        "fileName": upload_file.file_name,
        "fileSize": upload_file.file_size,
        "uti": upload_file.uti,
        "assetDeliveryState": {
            "state": "UPLOAD_COMPLETE" if upload_file.committed else "AWAITING_UPLOAD",
            "errors": [],
            "warnings": [],
        },
    }
    if upload_file.committed and upload_file.sha256:
        attributes["sourceFileChecksums"] = {"file": {"hash": upload_file.sha256, "algorithm": "SHA_256"}}
    else:
        attributes["uploadOperations"] = upload_operations(base, upload_file)
    return {
        "type": "buildUploadFiles",
        "id": upload_file.id,
        "attributes": attributes,
        "links": {"self": f"{base}/v1/buildUploadFiles/{upload_file.id}"},
    }


def build_resource(base: str, state: ConnectState, build: Build) -> dict[str, Any]:
    return {
        "type": "builds",
        "id": build.id,
        "attributes": {
            "version": build.version,
            "uploadedDate": iso(build.uploaded),
            "processingState": state.processing_state(build),
            "expired": False,
        },
        "relationships": {
            "app": {"data": {"type": "apps", "id": build.app_id}},
            "buildUpload": {"data": {"type": "buildUploads", "id": build.upload_id}},
        },
        "links": {"self": f"{base}/v1/builds/{build.id}"},
    }


def collection(self_link: str, data: list[dict[str, Any]], limit: int, total: int) -> dict[str, Any]:
    return {"data": data, "links": {"self": self_link}, "meta": {"paging": {"total": total, "limit": limit}}}
