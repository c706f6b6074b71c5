"""POST /regions/{region}/claims (an agent's claim of a stage its region's queue handed it, with
the job's credentials), /sessions (those credentials again, for the claim whose attempt holds its
lease), /accepts, /heartbeats and /outcomes (the attempt's tasks, answered for the claim that holds
it: the agent never holds a task token), /plans (a sharded stage's test plan, made once per
stage of a job: relevo_core.fleet.test_plans) — IAM: the region's agent role (relevo_core.fleet.claims)."""

from datetime import UTC, datetime
from http import HTTPStatus

from aws_lambda_powertools.event_handler import APIGatewayRestResolver

from relevo_core.config.agent_sessions import agent_sessions_settings
from relevo_core.fleet.claims import (
    accept_dispatch,
    claim_stage,
    heartbeat,
    ready,
    renew_session,
    report_outcome,
)
from relevo_core.fleet.test_plans import plan_for_shard
from relevo_core.http import json_body, json_response, register_error_handlers
from relevo_core.models.agent_session import (
    AcceptRequest,
    ClaimRequest,
    HeartbeatRequest,
    OutcomeReport,
    PlanRequest,
    SessionRequest,
)
from relevo_core.observability import correlate, lambda_entry

app = APIGatewayRestResolver()
register_error_handlers(app)
ready()


@app.post("/regions/<region>/claims")
def claim(region: str):
    request = ClaimRequest.from_body(json_body(app))
    correlate(request.job_id)
    granted = claim_stage(agent_sessions_settings(), region, request, datetime.now(UTC))
    return json_response(HTTPStatus.OK, granted.model_dump(mode="json"))


@app.post("/regions/<region>/sessions")
def session(region: str):
    request = SessionRequest.from_body(json_body(app))
    correlate(request.job_id)
    granted = renew_session(agent_sessions_settings(), region, request, datetime.now(UTC))
    return json_response(HTTPStatus.OK, granted.model_dump(mode="json"))


@app.post("/regions/<region>/accepts")
def accept(region: str):
    request = AcceptRequest.from_body(json_body(app))
    correlate(request.job_id)
    answered = accept_dispatch(agent_sessions_settings(), region, request, datetime.now(UTC))
    return json_response(HTTPStatus.OK, answered.model_dump(mode="json"))


@app.post("/regions/<region>/heartbeats")
def beat(region: str):
    request = HeartbeatRequest.from_body(json_body(app))
    correlate(request.job_id)
    answered = heartbeat(agent_sessions_settings(), region, request, datetime.now(UTC))
    return json_response(HTTPStatus.OK, answered.model_dump(mode="json"))


@app.post("/regions/<region>/outcomes")
def outcome(region: str):
    request = OutcomeReport.from_body(json_body(app))
    correlate(request.job_id)
    answered = report_outcome(agent_sessions_settings(), region, request, datetime.now(UTC))
    return json_response(HTTPStatus.OK, answered.model_dump(mode="json"))


@app.post("/regions/<region>/plans")
def plan(region: str):
    request = PlanRequest.from_body(json_body(app))
    correlate(request.job_id)
    granted = plan_for_shard(agent_sessions_settings(), region, request, datetime.now(UTC))
    return json_response(HTTPStatus.OK, granted.model_dump(mode="json"))


@lambda_entry()
def lambda_handler(event, context):
    return app.resolve(event, context)
