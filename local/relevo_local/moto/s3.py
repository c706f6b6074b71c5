"""S3 answers on the emulator as AWS gives them where they depend on the caller's permissions.

- **A missing key.** S3 tells a caller that a key does not exist only when the caller may list
  the bucket: "If the object you request doesn't exist, the error that Amazon S3 returns depends
  on whether you also have the s3:ListBucket permission. If you have the s3:ListBucket permission
  on the bucket, Amazon S3 returns an HTTP status code 404 Not Found error. If you don't have the
  s3:ListBucket permission, Amazon S3 returns an HTTP status code 403 Access Denied error"
  (Amazon S3 API Reference, GetObject and HeadObject, "Permissions"). A HEAD has no body, so its
  403 carries no error code (botocore reports "403", "Forbidden"). The listing permission is
  asked with the key as `s3:prefix`, so a grant scoped by prefix covers the keys under it (as
  Ceph's RGW does "to match aws behavior", ceph/ceph#68577, and s3-tests'
  test_head_object_404_with_policy_prefix checks). moto 5.2.5 answers 404 NoSuchKey to anyone
  allowed s3:GetObject, so code that tells a missing object by its 404 passed locally and got
  a 403 on AWS.

Only the caller's identity policies are asked (with its session's tags resolved, relevo_local.moto.sts);
the bucket's own policy, which Relevo uses for Deny only, is not.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from relevo_local.iam_evaluation import PolicyDecision, Request, evaluate
from relevo_local.identity import issued_key, policy_documents

_PATCHED: set[str] = set()


def _caller(response: Any) -> Any:
    """The emulator's record of the key that signed this request (header or query string), or None."""
    authorization = str(response.headers.get("Authorization") or "")
    found = re.search(r"Credential=([^/]+)/", authorization)
    if found:
        return issued_key(found.group(1), response.headers.get("X-Amz-Security-Token"))
    fields = dict(parse_qsl(urlsplit(response.uri).query, keep_blank_values=True))
    if "X-Amz-Credential" in fields:
        return issued_key(fields["X-Amz-Credential"].split("/", 1)[0], fields.get("X-Amz-Security-Token"))
    return None


def _may_list(response: Any, bucket: str, key: str) -> bool:
    """Whether the caller of this request may s3:ListBucket `bucket` for the prefix `key`
    (always, before the emulator enforces IAM: moto answers as it would)."""
    from moto import settings
    from moto.core.authorization import ActionAuthenticatorMixin

    if ActionAuthenticatorMixin.request_count < settings.INITIAL_NO_AUTH_ACTION_COUNT:
        return True
    caller = _caller(response)
    if caller is None:
        return False
    request = Request(action="s3:ListBucket", resource=f"arn:aws:s3:::{bucket}", context={"s3:prefix": key})
    return evaluate(policy_documents(caller.collect_policies()), request) is PolicyDecision.ALLOW


def refuse_missing_keys_without_list_bucket() -> None:
    """A GetObject or HeadObject of a key the bucket does not hold answers 403 to a caller that may
    not s3:ListBucket the bucket (for that key as prefix), 404 to one that may (module
    docstring); moto 5.2.5 answers 404 NoSuchKey to everyone."""
    if "missing_keys" in _PATCHED:
        return
    from moto.s3.exceptions import MissingKey, S3AccessDeniedError
    from moto.s3.responses import S3Response

    original_get = S3Response.get_object
    original_head = S3Response.head_object

    def get_object(self: Any) -> Any:
        try:
            return original_get(self)
        except MissingKey as missing:
            if _may_list(self, self.bucket_name, missing.key or self.parse_key_name()):
                raise
            raise S3AccessDeniedError() from missing

    def head_object(
        self: Any, bucket_name: str, query: dict[str, Any], key_name: str, headers: dict[str, Any]
    ) -> Any:
        status, response_headers, body = original_head(self, bucket_name, query, key_name, headers)
        if status == 404 and not _may_list(self, bucket_name, key_name):
            return 403, {}, ""
        return status, response_headers, body

    S3Response.get_object = get_object
    S3Response.head_object = head_object
    _PATCHED.add("missing_keys")
