"""PUT and GET /groups/{group}, POST /groups/{group}/test (stack admins), GET /deliveries (IAM):
project groups' notification channels, and the record of every delivery in and out."""

from http import HTTPStatus

from aws_lambda_powertools.event_handler import APIGatewayRestResolver
from aws_lambda_powertools.utilities import parameters

from relevo_core.config.notify import group_api_settings
from relevo_core.http import caller_arn, json_body, json_response, register_error_handlers
from relevo_core.models.requests import DeliveryListQuery, parse_query
from relevo_core.notify.channels import apply_group, show_group, test_group
from relevo_core.notify.deliveries import list_deliveries
from relevo_core.notify.sending import Clock, Urllib3Transport
from relevo_core.observability import lambda_entry

app = APIGatewayRestResolver()
register_error_handlers(app)


@app.put("/groups/<group>")
def put_group(group: str):
    return json_response(
        HTTPStatus.OK, apply_group(group_api_settings(), group, json_body(app), caller_arn(app))
    )


@app.get("/groups/<group>")
def get_group(group: str):
    return json_response(
        HTTPStatus.OK, show_group(group_api_settings(), group, caller_arn(app)).model_dump(mode="json")
    )


@app.post("/groups/<group>/test")
def post_group_test(group: str):
    settings = group_api_settings()
    secret = lambda name: str(parameters.get_secret(name, max_age=settings.secret_max_age_sec))  # noqa: E731
    return json_response(
        HTTPStatus.OK, test_group(settings, group, caller_arn(app), Urllib3Transport(), Clock(), secret)
    )


@app.get("/deliveries")
def deliveries():
    query = parse_query(DeliveryListQuery, app.current_event.query_string_parameters)
    listed = list_deliveries(group_api_settings(), caller_arn(app), query.project, query.failed)
    return json_response(HTTPStatus.OK, {"deliveries": listed, "count": len(listed)})


@lambda_entry()
def lambda_handler(event, context):
    return app.resolve(event, context)
