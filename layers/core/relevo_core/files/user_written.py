"""Files people write (a project file, an agent's TOML): each mistake in one line that names the
file, the line and the field, the way a compiler would, and only the mistakes themselves.

The CLI and the agent both read such files; neither depends on the other, so the reading and the
wording live here. pydantic reports where in the data a value is wrong (`loc`); the caller gives a
`locate(loc)` that turns that into a line of the file, from its own parser's positions.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

Loc = tuple[str | int, ...]
# The 1-based line of the value at `loc` (or of the mapping that should hold it), if known.
Locator = Callable[[Loc], int | None]


@dataclass(frozen=True)
class FileMistake:
    path: Path
    message: str
    line: int | None = None
    column: int | None = None
    field: str | None = None

    def __str__(self) -> str:
        where = str(self.path)
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        return f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"


class InvalidFile(ValueError):
    """One or more mistakes in a file; str() is one line per mistake."""

    def __init__(self, mistakes: Sequence[FileMistake]) -> None:
        self.mistakes = list(mistakes)
        super().__init__("\n".join(str(mistake) for mistake in self.mistakes))

    @classmethod
    def one(cls, path: Path, message: str, line: int | None = None, column: int | None = None) -> InvalidFile:
        return cls([FileMistake(path, message, line, column)])


def read_text(path: Path, what: str = "file") -> str:
    """The file as UTF-8 text; a missing, unreadable or non-UTF-8 file is a mistake naming it."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InvalidFile.one(path, f"no such {what}") from None
    except IsADirectoryError:
        raise InvalidFile.one(path, f"is a directory, not a {what}") from None
    except OSError as exc:
        raise InvalidFile.one(path, f"cannot read the {what}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise InvalidFile.one(
            path, f"not UTF-8 text (byte 0x{data[exc.start]:02x}); save the file as UTF-8", line, column
        ) from None


def field_name(loc: Loc) -> str:
    """`stages[0].run` for ("stages", 0, "run")."""
    name = ""
    for part in loc:
        name += f"[{part}]" if isinstance(part, int) else (f".{part}" if name else str(part))
    return name or "(top level)"


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        found += _models_in(arg)
    return found


def _container_value(annotation: Any) -> list[Any]:
    """What the items (or dict values) of a list / tuple / dict annotation are."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        return [value for arg in typing.get_args(annotation) for value in _container_value(arg)]
    if origin in (list, tuple, set, frozenset, dict):
        args = [arg for arg in typing.get_args(annotation) if arg is not Ellipsis]
        return args[-1:] if args else []
    return []


def keys_at(model: type[BaseModel], loc: Loc) -> list[str]:
    """The keys the model allows in the mapping at `loc` (the parent of a key), or [] if unknown."""
    annotations: list[Any] = [model]
    for part in loc:
        following: list[Any] = []
        for annotation in annotations:
            for candidate in _models_in(annotation):
                if isinstance(part, str) and part in candidate.model_fields:
                    following.append(candidate.model_fields[part].annotation)
            following += _container_value(annotation)
        annotations = following
    return sorted(
        {name for annotation in annotations for m in _models_in(annotation) for name in m.model_fields}
    )


def _message(error: ErrorDetails) -> str:
    kind, message = error["type"], str(error["msg"])
    if kind == "missing":
        return "required, but not set"
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    if (
        kind not in ("model_type", "dict_type")
        and "input" in error
        and not isinstance(error["input"], (dict, list))
    ):
        given = repr(error["input"])
        message += f" (got {given if len(given) <= 60 else given[:57] + '...'})"
    return message


def mistakes_of(
    exc: ValidationError, model: type[BaseModel], path: Path, locate: Locator
) -> list[FileMistake]:
    """The file's mistakes, one per problem pydantic found, minus the side effects of a typo: an
    unknown key that looks like a known one (`stage` for `stages`) is reported with a "did you
    mean", and the error that the known key is then missing is left out."""
    errors = exc.errors(include_url=False)
    mistakes: list[FileMistake] = []
    meant: set[Loc] = set()
    for error in errors:
        loc = tuple(error["loc"])
        if error["type"] != "extra_forbidden" or not loc or not isinstance(loc[-1], str):
            continue
        close = closest(loc[-1], keys_at(model, loc[:-1]))
        hint = f" (did you mean {close!r}?)" if close else ""
        if close:
            meant.add(loc[:-1] + (close,))
        mistakes.append(
            FileMistake(
                path,
                f"unknown key {loc[-1]!r}{hint}",
                locate(loc),
                field=field_name(loc[:-1]) if loc[:-1] else None,
            )
        )
    for error in errors:
        loc = tuple(error["loc"])
        if error["type"] == "extra_forbidden":
            continue
        if any(loc[: len(target)] == target for target in meant):
            continue  # the key the typo meant: its absence is the typo's doing, not a mistake of its own
        if error["type"] == "too_short" and any(
            len(other["loc"]) > len(loc) and tuple(other["loc"][: len(loc)]) == loc for other in errors
        ):
            # "at least 1 item": pydantic counts only the items that validated, so a bad item says it too.
            continue
        # A model-wide check (loc empty) names its fields in its message and has no line of its own.
        mistakes.append(
            FileMistake(
                path, _message(error), locate(loc) if loc else None, field=field_name(loc) if loc else None
            )
        )
    return sorted(mistakes, key=lambda m: (m.line or 0, m.field or ""))


def validate(model: type[BaseModel], data: Any, path: Path, locate: Locator, **context: Any) -> Any:
    """`model.model_validate(data)`, its failure an InvalidFile naming lines and fields."""
    try:
        return model.model_validate(data, context=context or None)
    except ValidationError as exc:
        raise InvalidFile(mistakes_of(exc, model, path, locate)) from exc


SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def file_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The JSON Schema (2020-12) of a file the model reads: what editors validate and complete with."""
    return {"$schema": SCHEMA_DIALECT, **model.model_json_schema()}


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name a typo of `name` most likely meant, if one is close enough."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return close[0] if close else None
