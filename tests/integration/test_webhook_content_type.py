"""A GitHub webhook left at its default content type: GitHub's docs ("Creating webhooks", Content
type) say application/x-www-form-urlencoded sends the JSON payload as a form parameter called
`payload`, application/json as the body itself. Relevo reads only the latter, and its refusal says
which setting to change."""

from __future__ import annotations

import secrets
from urllib.parse import urlencode

from tests.helpers.payloads import push_body
from tests.helpers.stack import deliver, register_project


def test_a_form_encoded_delivery_is_refused_with_the_setting_to_change(local_stack, project_id):
    secret = register_project(local_stack, project_id, [{"name": "build", "run": "make"}])
    form = urlencode({"payload": push_body(f"acme/{project_id}", secrets.token_hex(20)).decode()}).encode()

    response = deliver(
        local_stack, project_id, form, secret, **{"Content-Type": "application/x-www-form-urlencoded"}
    )

    assert response.status_code == 400
    assert response.json() == {
        "error": "MALFORMED_JSON",
        "message": "body is not JSON: it is form-encoded (payload=…); set the webhook's content type to "
        "application/json (GitHub: Settings → Webhooks → Content type)",
    }
