"""GET /openapi.json: the API's OpenAPI document (generated from the resolvers; IAM)."""

from http import HTTPStatus

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response

from relevo_core.http import register_error_handlers
from relevo_core.observability import lambda_entry
from relevo_core.openapi import published_document

app = APIGatewayRestResolver()
register_error_handlers(app)


@app.get("/openapi.json")
def openapi_document():
    return Response(status_code=HTTPStatus.OK, content_type="application/json", body=published_document())


@lambda_entry()
def lambda_handler(event, context):
    return app.resolve(event, context)
