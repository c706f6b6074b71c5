"""API Gateway's IAM authentication of the local API (what `AWS_IAM` routes do before invoking
their function): the request's SigV4 signature checked against the secret of the key it names,
the caller's IAM policies allowing execute-api:Invoke on the method and path, and the caller's
identity as API Gateway hands it to the function (requestContext.identity)."""

from __future__ import annotations

from datetime import UTC, datetime
from urllib.parse import urlsplit

import boto3
from botocore.credentials import Credentials

from relevo_local import identity, sigv4
from relevo_local.sigv4 import Refusal


class IamAuthentication:
    """The authenticate callable of the API stand-in (relevo_local.apigateway.ApiAdapter), for the
    deployed API `api_id` and its stage, talking to the emulator at `endpoint`."""

    def __init__(self, endpoint: str, region: str, api_id: str, stage: str) -> None:
        self._endpoint = endpoint
        self._region = region
        self._api_id = api_id
        self._stage = stage
        # Who each access key belongs to, as STS said: asked once per key.
        self._identities: dict[str, dict[str, str]] = {}

    def __call__(
        self, method: str, url: str, headers: dict[str, str], body: bytes
    ) -> dict[str, str] | Refusal:
        """API Gateway's IAM authentication: the SigV4 signature is checked against the secret of
        the access key it names, then STS (called with that key's own credentials) says who the
        key belongs to. Nothing the client writes in a header names the caller."""
        signer = sigv4.verify(method, url, headers, body, self._credentials_for, datetime.now(UTC))
        if isinstance(signer, Refusal):
            return signer
        token = next((v for k, v in headers.items() if k.lower() == "x-amz-security-token"), None)
        # Then IAM: the caller's policies must allow execute-api:Invoke on this method and path
        # ("Control access to a REST API with IAM permissions", API Gateway Developer Guide).
        invoked = (
            f"arn:aws:execute-api:{self._region}:{identity.ACCOUNT_ID}:{self._api_id}{urlsplit(url).path}"
        )
        invoked = invoked.replace(
            f"{self._api_id}/{self._stage}/", f"{self._api_id}/{self._stage}/{method}/", 1
        )
        if not identity.permits(signer, token, "execute-api:Invoke", invoked):
            return Refusal(
                f"User: {self._caller_arn(signer, token)} is not authorized to perform: execute-api:Invoke "
                f"on resource: {invoked}",
                "ACCESS_DENIED",
            )
        if signer not in self._identities:
            credentials = self._credentials_for(signer, token)
            assert credentials is not None  # verify() just found them
            sts = boto3.client(
                "sts",
                endpoint_url=self._endpoint,
                region_name=self._region,
                aws_access_key_id=credentials.access_key,
                aws_secret_access_key=credentials.secret_key,
                aws_session_token=credentials.token,
            )
            caller = sts.get_caller_identity()
            self._identities[signer] = {
                "accessKey": signer,
                "accountId": caller["Account"],
                "caller": caller["UserId"],
                "user": caller["UserId"],
                "userArn": caller["Arn"],
            }
        return self._identities[signer]

    def _caller_arn(self, access_key: str, session_token: str | None) -> str:
        return str(identity.issued_key(access_key, session_token).arn)

    def _credentials_for(self, access_key: str, session_token: str | None) -> Credentials | None:
        """The credentials of a key the emulator issued (IAM user keys; STS session keys with
        their own session token)."""
        key = identity.issued_key(access_key, session_token)
        return None if key is None else key.create_credentials()
