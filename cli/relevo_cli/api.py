"""The Relevo API as the CLI sees it: SigV4-signed requests (IAM), JSON in and out."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import boto3
import requests
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest

from relevo_core.files.stack import StackInfo


class SigV4RequestAuth(requests.auth.AuthBase):
    """Signs a prepared `requests` request for API Gateway (IAM auth) with the session's credentials."""

    def __init__(self, session: boto3.session.Session, region: str) -> None:
        self.session = session
        self.region = region

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        credentials = self.session.get_credentials()
        if credentials is None:
            raise RuntimeError("no AWS credentials: set AWS_PROFILE or AWS_ACCESS_KEY_ID")
        body = request.body or b""
        signed = AWSRequest(
            method=request.method,
            url=request.url,
            data=body.encode() if isinstance(body, str) else body,
            headers={k: v for k, v in request.headers.items() if k.lower() in ("content-type", "host")},
        )
        SigV4Auth(credentials.get_frozen_credentials(), "execute-api", self.region).add_auth(signed)
        request.headers.update(dict(signed.headers))
        return request


class ApiError(Exception):
    def __init__(self, status: int, body: Any) -> None:
        code = body.get("error") if isinstance(body, dict) else None
        message = body.get("message") if isinstance(body, dict) else str(body)
        super().__init__(f"{status} {code or ''} {message}".strip())
        self.status = status
        self.code = code
        self.body = body


@dataclass
class RelevoApi:
    base_url: str
    region: str
    session: boto3.session.Session

    @classmethod
    def for_stack(cls, stack: StackInfo) -> RelevoApi:
        return cls(stack.api_url.rstrip("/"), stack.region, boto3.session.Session(region_name=stack.region))

    def request(self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else b""
        response = requests.request(
            method,
            self.base_url + path,
            params=params,
            data=data,
            headers={"Content-Type": "application/json"},
            auth=SigV4RequestAuth(self.session, self.region),
            timeout=30,
        )
        try:
            payload = response.json()
        except ValueError:
            payload = response.text
        if response.status_code >= 400:
            raise ApiError(response.status_code, payload)
        return payload

    def get_job(self, job_id: str) -> dict[str, Any]:
        return self.request("GET", f"/jobs/{job_id}")

    def job_cost(self, job_id: str) -> dict[str, Any]:
        return self.request("GET", f"/jobs/{job_id}/cost")

    def list_jobs(self, **filters: Any) -> dict[str, Any]:
        return self.request("GET", "/jobs", params={k: v for k, v in filters.items() if v is not None})

    def put_project(self, project_id: str, project: dict[str, Any]) -> dict[str, Any]:
        return self.request("PUT", f"/projects/{project_id}", project)

    def get_project(self, project_id: str) -> dict[str, Any]:
        return self.request("GET", f"/projects/{project_id}")

    def list_projects(self) -> dict[str, Any]:
        return self.request("GET", "/projects")

    def delete_project(self, project_id: str) -> dict[str, Any]:
        return self.request("DELETE", f"/projects/{project_id}")

    def grant(self, project_id: str, principal: str, level: str) -> dict[str, Any]:
        return self.request("PUT", f"/projects/{project_id}/grants", {"principal": principal, "level": level})

    def grants(self, project_id: str) -> dict[str, Any]:
        return self.request("GET", f"/projects/{project_id}/grants")

    def caches(self, project_id: str, region: str | None) -> dict[str, Any]:
        return self.request(
            "GET", f"/projects/{project_id}/caches", params={"region": region} if region else None
        )

    def cache_entry(self, project_id: str, key: str, region: str | None) -> dict[str, Any]:
        params = {"key": key, **({"region": region} if region else {})}
        return self.request("GET", f"/projects/{project_id}/caches/entry", params=params)

    def delete_cache_entry(self, project_id: str, key: str, region: str | None) -> dict[str, Any]:
        params = {"key": key, **({"region": region} if region else {})}
        return self.request("DELETE", f"/projects/{project_id}/caches/entry", params=params)

    def run_project(self, project_id: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", f"/projects/{project_id}/run", body)

    def rerun_job(self, job_id: str, from_stage: str | None) -> dict[str, Any]:
        return self.request("POST", f"/jobs/{job_id}/rerun", {"from_stage": from_stage} if from_stage else {})

    def dead_letters(self) -> dict[str, Any]:
        return self.request("GET", "/dlq")

    def dead_letter(self, job_id: str) -> dict[str, Any]:
        return self.request("GET", f"/dlq/{job_id}")

    def redrive(self, job_id: str) -> dict[str, Any]:
        return self.request("POST", f"/dlq/{job_id}/redrive", {})

    def unfreeze_key(self, idempotency_key: str) -> dict[str, Any]:
        return self.request("POST", f"/dlq/keys/{quote(idempotency_key, safe='')}/unfreeze", {})

    def put_group(self, group: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.request("PUT", f"/groups/{group}", body)

    def test_group(self, group: str) -> dict[str, Any]:
        return self.request("POST", f"/groups/{group}/test", {})

    def deliveries(self, project: str | None = None, failed: bool = False) -> dict[str, Any]:
        params: dict[str, Any] = {"failed": "true"} if failed else {}
        if project:
            params["project"] = project
        return self.request("GET", "/deliveries", params=params or None)

    def approve(self, job_id: str, reason: str | None = None) -> dict[str, Any]:
        return self.request("POST", f"/jobs/{job_id}/approve", {"reason": reason} if reason else {})

    def reject(self, job_id: str, reason: str) -> dict[str, Any]:
        return self.request("POST", f"/jobs/{job_id}/reject", {"reason": reason})

    def resolve_stage(
        self, job_id: str, stage: str, resolution: str, reason: str | None = None, shard: int | None = None
    ) -> dict[str, Any]:
        body = {
            "as": resolution,
            **({"reason": reason} if reason else {}),
            **({"shard": shard} if shard is not None else {}),
        }
        return self.request("POST", f"/jobs/{job_id}/stages/{stage}/resolve", body)

    def cancel_job(self, job_id: str) -> dict[str, Any]:
        return self.request("POST", f"/jobs/{job_id}/cancel", {})

    def release_job(self, job_id: str) -> dict[str, Any]:
        return self.request("POST", f"/jobs/{job_id}/release", {})

    def pause_agent(self, agent_id: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", f"/agents/{agent_id}/pause", body)

    def resume_agent(self, agent_id: str, region: str | None = None) -> dict[str, Any]:
        return self.request(
            "POST", f"/agents/{agent_id}/resume", params={"region": region} if region else None
        )

    def pause_region(self, region: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", f"/regions/{region}/pause", body)

    def resume_region(self, region: str) -> dict[str, Any]:
        return self.request("POST", f"/regions/{region}/resume")

    def queue(self) -> dict[str, Any]:
        return self.request("GET", "/queue")

    def promote_job(self, job_id: str) -> dict[str, Any]:
        return self.request("POST", f"/jobs/{job_id}/promote", {})

    def set_priority(self, job_id: str, priority: int) -> dict[str, Any]:
        return self.request("POST", f"/jobs/{job_id}/priority", {"priority": priority})

    def delete_job(self, job_id: str) -> dict[str, Any]:
        return self.request("DELETE", f"/jobs/{job_id}")

    def job_logs(
        self,
        job_id: str,
        from_seq: int | str | None = None,
        before_seq: int | str | None = None,
        limit: int | None = None,
    ) -> dict[str, Any]:
        params = {"from_seq": from_seq, "before_seq": before_seq, "limit": limit}
        return self.request(
            "GET", f"/jobs/{job_id}/logs", params={k: v for k, v in params.items() if v is not None}
        )

    def job_tests(
        self,
        job_id: str,
        status: str | None = None,
        limit: int | None = None,
        page_token: str | None = None,
        slowest: int | None = None,
    ) -> dict[str, Any]:
        """One page of the job's tests (GET /jobs/{id}/tests): counts, tests, next_page_token."""
        params = {"status": status, "limit": limit, "page_token": page_token, "slowest": slowest}
        return self.request(
            "GET", f"/jobs/{job_id}/tests", params={k: v for k, v in params.items() if v is not None}
        )

    def artifact_link(
        self, job_id: str, name: str, stage: str | None = None, shard: int | None = None
    ) -> dict[str, Any]:
        params = {
            key: value for key, value in (("stage", stage), ("shard", shard)) if value is not None
        } or None
        return self.request("GET", f"/jobs/{job_id}/artifacts/{quote(name, safe='')}", params=params)
