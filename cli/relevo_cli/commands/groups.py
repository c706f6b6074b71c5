"""`relevo group apply|test` and `relevo delivery list`: project groups' notification channels, and
the record of every delivery in (webhooks) and out (commit statuses, notifications). `relevo
deliveries` is the older spelling (a hidden alias)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from relevo_cli.commands.common import StackOption, add_column, console, listing, show, stack_api
from relevo_cli.project_file import parse
from relevo_core.files.user_written import InvalidFile, validate
from relevo_core.models.group import Group

group_app = typer.Typer(
    no_args_is_help=True, help="Project groups: the notification channels of every project in a group."
)
delivery_app = typer.Typer(
    no_args_is_help=True, help="Deliveries in (webhooks) and out (commit statuses, notifications)."
)


def load_group_file(path: Path) -> dict:
    """The group file's mapping, checked: a mistake names its file, line and field."""
    document, locate = parse(path, "group file")
    if not isinstance(document, dict):
        raise InvalidFile.one(path, "a group file is a YAML mapping of keys (name:, channels:, events:)", 1)
    validate(Group, document, path, locate)
    return document


@group_app.command("apply")
def group_apply(
    file: Path = typer.Argument(..., help="the group file (YAML)"), stack_file: Path | None = StackOption
) -> None:
    """Define a group's channels (Slack webhook secret, email addresses) and the events it hears."""
    document = load_group_file(file)
    with stack_api(stack_file) as api:
        applied = api.put_group(document["name"], document)
    group, subscriptions = applied["group"], applied["email_subscriptions"]
    console.print(
        f"group [bold]{group['name']}[/bold]: {len(group['channels'])} channels, events "
        f"{', '.join(group['events'])}"
    )
    if subscriptions["subscribed"]:
        console.print(
            "email subscriptions to confirm (SNS mails each address): "
            f"{', '.join(subscriptions['subscribed'])}"
        )
    if subscriptions["removed"]:
        console.print(f"email subscriptions removed: {', '.join(subscriptions['removed'])}")
    if subscriptions.get("pending"):
        console.print(
            f"email subscriptions still waiting for their address to confirm (SNS changes no filter before): "
            f"{', '.join(subscriptions['pending'])}; apply this group again once they have confirmed"
        )


@group_app.command("test")
def group_test(
    group: str = typer.Argument(..., help="the group's name"), stack_file: Path | None = StackOption
) -> None:
    """Send one test message to each of the group's channels; exit 1 when one was not delivered."""
    with stack_api(stack_file) as api:
        tested = api.test_group(group)
    table = Table(title=f"test messages of group {group}")
    for column in ("channel", "kind", "outcome", "HTTP", "reason"):
        add_column(table, column)
    for result in tested["results"]:
        table.add_row(
            str(result["channel"]),
            result["kind"],
            result["outcome"],
            str(result["http_status"] or "-"),
            result["reason"] or "",
        )
    console.print(table)
    if any(result["outcome"] != "delivered" for result in tested["results"]):
        raise typer.Exit(1)


@delivery_app.command("list")
def deliveries(
    project: str | None = typer.Option(None, "--project", help="one project's deliveries"),
    failed: bool = typer.Option(False, "--failed", help="only what failed, was refused or is being retried"),
    as_json: bool = typer.Option(False, "--json", help="print the records as JSON"),
    stack_file: Path | None = StackOption,
) -> None:
    """Deliveries in (webhooks: accepted, duplicate, ignored, refused) and out (commit statuses,
    notifications), newest first."""
    columns = ("at", "", "project", "target", "event", "outcome", "HTTP", "attempt", "ms", "job / reason")
    show(
        stack_file,
        lambda api: api.deliveries(project, failed),
        as_json,
        lambda listed: [
            listing(f"{listed['count']} deliveries", columns, map(_delivery_row, listed["deliveries"]))
        ],
        as_data=lambda listed: listed["deliveries"],
    )


def _delivery_row(r: dict) -> tuple[str, ...]:
    return (
        r["at"],
        "in" if r["direction"] == "incoming" else "out",
        r["project"],
        r["target"],
        r["event"],
        r["outcome"],
        str(r.get("http_status", "-")),
        str(r.get("attempt", "")),
        str(r.get("latency_ms", "")),
        " ".join(x for x in (r.get("job_id"), r.get("reason")) if x),
    )
