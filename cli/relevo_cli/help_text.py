"""`relevo --help` as a person reads it: each option's name, its help and its default, without the
type tags typer adds (`<bool>`, `<str>`, `<int range> [1<=x<=500]`). A choice keeps its values
(`succeeded|retry|failed`): they are what to type."""

from __future__ import annotations

import click


def _untyped(param: click.Parameter) -> None:
    descriptor = getattr(param, "type_descriptor", None)
    if isinstance(getattr(param, "type", None), click.Choice) or getattr(descriptor, "is_choice", False):
        return
    # Instance attributes shadow the methods typer's help calls (rich_utils): no type, no range.
    param.display_type_rich = lambda ctx: None  # type: ignore[attr-defined]  # typer's help reads it
    param._get_number_range_help_str = lambda: None  # type: ignore[attr-defined]  # typer's help reads it


def without_type_tags(command: click.Command) -> None:
    """Every parameter of `command` and of the commands under it, shown without its type: the
    parameters as help lists them (get_params: with --help and the completion options, which are
    added after the command is made)."""
    listed = command.get_params

    def get_params(ctx: click.Context) -> list[click.Parameter]:
        params = listed(ctx)
        for param in params:
            _untyped(param)
        return params

    command.get_params = get_params  # type: ignore[method-assign]  # help lists params by it
    for sub in getattr(command, "commands", {}).values():
        without_type_tags(sub)
