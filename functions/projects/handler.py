"""PUT, GET and DELETE /projects/{project_id}, GET /projects, and who may do what to a project:
PUT and GET /projects/{project_id}/grants (IAM); its cache entries: GET /projects/{project_id}/caches,
GET and DELETE /projects/{project_id}/caches/entry (?region=&key=)."""

from http import HTTPStatus

from aws_lambda_powertools.event_handler import APIGatewayRestResolver

from relevo_core.caches.listing import delete_cache, list_caches, show_cache
from relevo_core.config import access_settings
from relevo_core.config.cache_eviction import cache_bucket_settings
from relevo_core.config.scheduler import scheduler_settings
from relevo_core.http import caller_arn, json_body, json_response, register_error_handlers
from relevo_core.models.access import Level
from relevo_core.observability import lambda_entry
from relevo_core.projects.permissions import requires
from relevo_core.projects.registry import (
    apply_project,
    delete_project,
    list_grants,
    set_grant,
    show_project,
    visible_projects,
)

app = APIGatewayRestResolver()
register_error_handlers(app)


@app.put("/projects/<project_id>")
def put_project(project_id: str):
    # Creating is open to any caller IAM lets through; changing needs manage (checked inside).
    project = apply_project(
        access_settings(), project_id, json_body(app), caller_arn(app), scheduler_settings()
    )
    return json_response(HTTPStatus.OK, project.model_dump(mode="json"))


@app.get("/projects/<project_id>", middlewares=[requires(Level.VIEW)])
def project(project_id: str):
    return json_response(HTTPStatus.OK, show_project(access_settings(), project_id).model_dump(mode="json"))


@app.delete("/projects/<project_id>", middlewares=[requires(Level.MANAGE)])
def remove_project(project_id: str):
    return json_response(HTTPStatus.OK, delete_project(access_settings(), project_id, scheduler_settings()))


@app.get("/projects")
def all_projects():
    projects = [
        project.model_dump(mode="json") for project in visible_projects(access_settings(), caller_arn(app))
    ]
    return json_response(HTTPStatus.OK, {"projects": projects, "count": len(projects)})


@app.put("/projects/<project_id>/grants", middlewares=[requires(Level.MANAGE)])
def put_grant(project_id: str):
    return json_response(
        HTTPStatus.OK, set_grant(access_settings(), project_id, json_body(app), caller_arn(app))
    )


@app.get("/projects/<project_id>/grants", middlewares=[requires(Level.VIEW)])
def grants(project_id: str):
    listed = list_grants(access_settings(), project_id)
    return json_response(HTTPStatus.OK, {"grants": listed, "count": len(listed)})


def _query(name: str) -> str | None:
    return (app.current_event.query_string_parameters or {}).get(name)


@app.get("/projects/<project_id>/caches", middlewares=[requires(Level.VIEW)])
def caches(project_id: str):
    return json_response(
        HTTPStatus.OK, list_caches(access_settings().table_name, project_id, _query("region"))
    )


@app.get("/projects/<project_id>/caches/entry", middlewares=[requires(Level.VIEW)])
def cache_entry(project_id: str):
    table = access_settings().table_name
    return json_response(HTTPStatus.OK, show_cache(table, project_id, _query("region"), _query("key")))


@app.delete("/projects/<project_id>/caches/entry", middlewares=[requires(Level.OPERATE)])
def remove_cache_entry(project_id: str):
    return json_response(
        HTTPStatus.OK,
        delete_cache(
            access_settings().table_name,
            cache_bucket_settings().artifact_bucket,
            project_id,
            _query("region"),
            _query("key"),
        ),
    )


@lambda_entry()
def lambda_handler(event, context):
    return app.resolve(event, context)
