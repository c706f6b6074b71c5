"""The local API holds a burst the way API Gateway does: API Gateway's throttling docs make the burst
limit (5,000 by default) the number of concurrent requests it fulfils before answering 429, so 100
concurrent deliveries are all answered, never reset. Here 100 signed deliveries of one push arrive
at once: every one gets a 2xx, exactly one job is made, and no connection is reset."""

from __future__ import annotations

import secrets
import threading
from collections import Counter

import requests

from tests.helpers.payloads import push_body
from tests.helpers.stack import deliver, register_project, table_items

BURST = 100


def test_a_burst_of_signed_deliveries_of_one_push_is_answered_with_one_job(local_stack, project_id):
    secret = register_project(local_stack, project_id, [{"name": "build", "run": "make"}])
    body = push_body(f"acme/{project_id}", secrets.token_hex(20))
    start = threading.Barrier(BURST)
    answers: list[int] = []
    failures: list[str] = []

    def one() -> None:
        start.wait()
        try:
            # Each its own connection (deliver() opens a new one): as GitHub's deliveries arrive.
            answers.append(deliver(local_stack, project_id, body, secret).status_code)
        except requests.RequestException as exc:
            failures.append(type(exc).__name__ + ": " + str(exc)[:120])

    threads = [threading.Thread(target=one) for _ in range(BURST)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)

    assert failures == [], f"{len(failures)} of {BURST} failed: {Counter(failures).most_common(3)}"
    assert Counter(answers) == {202: 1, 200: BURST - 1}
    jobs = [
        item
        for item in table_items(local_stack, "JOB#")
        if item["sk"]["S"] == "JOB" and item["project"]["S"] == project_id
    ]
    assert len(jobs) == 1
