"""PUT /projects/{project_id}, GET /projects/{project_id}, GET /projects: the project registry (IAM)."""

from http import HTTPStatus

from aws_lambda_powertools.event_handler import APIGatewayRestResolver
from aws_lambda_powertools.logging import correlation_paths

from relevo_core.config import scheduler_settings, table_settings
from relevo_core.http import caller_arn, json_body, json_response, register_error_handlers
from relevo_core.observability import logger, tracer
from relevo_core.registry import apply_project
from relevo_core.store.projects import get_project, list_projects

app = APIGatewayRestResolver()
register_error_handlers(app)


@app.put("/projects/<project_id>")
def put_project(project_id: str):
    project = apply_project(
        table_settings().table_name, project_id, json_body(app), caller_arn(app), scheduler_settings()
    )
    return json_response(HTTPStatus.OK, project.model_dump(mode="json"))


@app.get("/projects/<project_id>")
def show_project(project_id: str):
    return json_response(HTTPStatus.OK, get_project(table_settings().table_name, project_id).model_dump(mode="json"))


@app.get("/projects")
def all_projects():
    projects = [project.model_dump(mode="json") for project in list_projects(table_settings().table_name)]
    return json_response(HTTPStatus.OK, {"projects": projects, "count": len(projects)})


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_REST)
@tracer.capture_lambda_handler
def lambda_handler(event, context):
    return app.resolve(event, context)
