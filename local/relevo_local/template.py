"""From `template.yaml` to what the embedded emulator can create, the way `sam deploy` would.

Steps, each what AWS does in the cloud: expand AWS::LanguageExtensions (Fn::ForEach), package
local code to S3, inline state machine definitions, run the SAM transform, then fold
DefinitionSubstitutions into the definition (the emulator's CloudFormation ignores that property).
"""

from __future__ import annotations

import copy
import io
import json
import os
import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

LANGUAGE_EXTENSIONS = "AWS::LanguageExtensions"


@dataclass(frozen=True)
class SamFunction:
    """A function of the template and the API routes its `Api` events declare."""

    logical_id: str
    code_dir: Path
    handler: str
    routes: tuple[tuple[str, str, bool], ...]  # (method, path, iam_auth)
    schedules: tuple[tuple[str, float], ...] = ()  # (event name, period in seconds)
    # (event name, logical id of the table whose stream it reads, batch size)
    # (event name, table, batch size, FilterCriteria patterns)
    streams: tuple[tuple[str, str, int, tuple[str, ...]], ...] = ()


def load_sam_template(path: Path, parameters: dict[str, str] | None = None) -> dict[str, Any]:
    """Parse the template (short-form intrinsics included) and expand Fn::ForEach.

    cfn-lint's implementation of the language extensions resolves the collection from the
    parameters' values, so overrides are applied as defaults first.
    """
    from cfnlint.decode import decode
    from cfnlint.template import Template
    from cfnlint.template.transforms._language_extensions import language_extension

    decoded, problems = decode(str(path))
    if problems:
        raise ValueError(f"{path}: {problems[0].message}")
    for name, value in (parameters or {}).items():
        decoded.setdefault("Parameters", {}).setdefault(name, {})["Default"] = value
    transforms = decoded.get("Transform", [])
    transforms = transforms if isinstance(transforms, list) else [transforms]
    if LANGUAGE_EXTENSIONS in transforms:
        matches, expanded = language_extension(Template(str(path), decoded, ["us-east-1"]))
        if matches:
            raise ValueError(f"{path}: {matches[0].message}")
        expanded["Transform"] = [t for t in transforms if t != LANGUAGE_EXTENSIONS]
        decoded = expanded
    # Plain dicts and strs from here on (cfn-lint's nodes carry line marks).
    return json.loads(json.dumps(decoded))


def sam_functions(template: dict[str, Any], root: Path) -> list[SamFunction]:
    globals_fn = template.get("Globals", {}).get("Function", {})
    default_iam = (
        template.get("Resources", {})
        .get("Api", {})
        .get("Properties", {})
        .get("Auth", {})
        .get("DefaultAuthorizer")
        == "AWS_IAM"
    )
    functions = []
    for logical_id, resource in template.get("Resources", {}).items():
        if resource.get("Type") != "AWS::Serverless::Function":
            continue
        props = resource["Properties"]
        routes = []
        schedules = []
        streams = []
        for event_name, event in props.get("Events", {}).items():
            if event.get("Type") == "DynamoDB":
                stream = event["Properties"]["Stream"]
                table_id = (
                    stream["Fn::GetAtt"][0]
                    if isinstance(stream.get("Fn::GetAtt"), list)
                    else stream["Fn::GetAtt"].split(".")[0]
                )
                patterns = tuple(
                    f["Pattern"] for f in event["Properties"].get("FilterCriteria", {}).get("Filters", [])
                )
                streams.append(
                    (event_name, table_id, int(event["Properties"].get("BatchSize", 100)), patterns)
                )
                continue
            if event.get("Type") in ("Schedule", "ScheduleV2"):
                expression = event["Properties"].get("Schedule") or event["Properties"].get(
                    "ScheduleExpression"
                )
                schedules.append((event_name, rate_seconds(expression)))
                continue
            if event.get("Type") != "Api":
                continue
            auth = event["Properties"].get("Auth", {}).get("Authorizer")
            iam = auth == "AWS_IAM" or (auth is None and default_iam)
            routes.append((event["Properties"]["Method"].upper(), event["Properties"]["Path"], iam))
        functions.append(
            SamFunction(
                logical_id=logical_id,
                code_dir=(root / props["CodeUri"]).resolve(),
                handler=props.get("Handler", globals_fn.get("Handler", "handler.lambda_handler")),
                routes=tuple(routes),
                schedules=tuple(schedules),
                streams=tuple(streams),
            )
        )
    return functions


def rate_seconds(expression: str) -> float:
    """The period of an EventBridge `rate(...)` expression; cron schedules are not run locally."""
    match = re.fullmatch(r"rate\((\d+) (minute|minutes|hour|hours|day|days)\)", expression.strip())
    if not match:
        raise ValueError(f"only rate(...) schedules run on the local stack, not {expression!r}")
    unit = {"minute": 60, "hour": 3600, "day": 86400}[match.group(2).rstrip("s")]
    return int(match.group(1)) * unit


def _zip_dir(directory: Path, prefix: str = "") -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for folder, dirs, files in os.walk(directory):
            dirs[:] = sorted(d for d in dirs if d not in {"__pycache__"} and not d.endswith(".egg-info"))
            for name in sorted(files):
                if name.endswith(".pyc"):
                    continue
                full = Path(folder) / name
                archive.write(full, prefix + str(full.relative_to(directory)))
    return buffer.getvalue()


def package(template: dict[str, Any], root: Path, s3: Any, bucket: str) -> dict[str, Any]:
    """What `sam package` does: local code goes to S3, definitions are read from their files."""

    def upload(key: str, body: Callable[[], bytes]) -> str:
        s3.put_object(Bucket=bucket, Key=key, Body=body())
        return f"s3://{bucket}/{key}"

    return packaged_with(template, root, upload)


def packaged_with(
    template: dict[str, Any], root: Path, store: Callable[[str, Callable[[], bytes]], str]
) -> dict[str, Any]:
    """The template with local code replaced by `store(key, zipped code)`'s S3 URI and each state
    machine's DefinitionUri inlined. The zip is built only when `store` calls for it."""
    packaged = copy.deepcopy(template)
    for logical_id, resource in packaged.get("Resources", {}).items():
        props = resource.get("Properties", {})
        kind = resource.get("Type")
        if kind == "AWS::Serverless::Function" and isinstance(props.get("CodeUri"), str):
            code = root / props["CodeUri"]
            props["CodeUri"] = store(f"functions/{logical_id}.zip", partial(_zip_dir, code))
        elif kind == "AWS::Serverless::LayerVersion" and isinstance(props.get("ContentUri"), str):
            # `sam build` (BuildMethod python) places a layer's code under python/.
            content = root / props["ContentUri"]
            props["ContentUri"] = store(
                f"layers/{logical_id}.zip", partial(_zip_dir, content, prefix="python/")
            )
        elif kind == "AWS::Serverless::StateMachine" and isinstance(props.get("DefinitionUri"), str):
            props["Definition"] = json.loads((root / props.pop("DefinitionUri")).read_text())
    return packaged


class _NoManagedPolicyNames:
    """Offline translation: a policy named by its managed-policy name (not its ARN) cannot be
    resolved without IAM, so it is refused rather than guessed."""

    def load(self) -> dict[str, str]:
        raise ValueError("a Policies entry names a managed policy by name; offline translation needs its ARN")


def translate(template: dict[str, Any], parameters: dict[str, str], iam: Any | None) -> dict[str, Any]:
    """The SAM transform; `iam` resolves managed-policy names (None: offline, ARNs only)."""
    from samtranslator.translator.managed_policy_translator import ManagedPolicyLoader
    from samtranslator.translator.transform import transform

    loader = ManagedPolicyLoader(iam) if iam is not None else _NoManagedPolicyNames()
    # The translator asks boto3 for a region even when AWS::Region is given.
    region_unset = not os.environ.get("AWS_DEFAULT_REGION") and "AWS::Region" in parameters
    if region_unset:
        os.environ["AWS_DEFAULT_REGION"] = parameters["AWS::Region"]
    try:
        return transform(copy.deepcopy(template), dict(parameters), loader)
    finally:
        if region_unset:
            os.environ.pop("AWS_DEFAULT_REGION", None)


def fold_definition_substitutions(cfn: dict[str, Any]) -> None:
    """Apply DefinitionSubstitutions the way Step Functions does: each declared ${Key} of the
    definition is replaced by its (resolved) value, and nothing else is touched.

    Written as an Fn::Join of literal text and the values, because the emulator's CloudFormation
    ignores DefinitionSubstitutions and its Fn::Sub turns the ASL context prefix `$$.` into `$.`.
    """
    for resource in cfn.get("Resources", {}).values():
        if resource.get("Type") != "AWS::StepFunctions::StateMachine":
            continue
        props = resource["Properties"]
        substitutions = props.pop("DefinitionSubstitutions", None)
        if substitutions is None:
            continue
        definition = props.get("DefinitionString")
        if "Definition" in props:
            definition = json.dumps(props.pop("Definition"), indent=2)
        elif isinstance(definition, dict) and "Fn::Join" in definition:
            separator, parts = definition["Fn::Join"]
            if not all(isinstance(part, str) for part in parts):
                raise ValueError("state machine definition mixes intrinsics with DefinitionSubstitutions")
            definition = separator.join(parts)
        pieces: list[Any] = []
        for index, piece in enumerate(re.split(r"\$\{([A-Za-z0-9_]+)\}", definition)):
            if index % 2 == 0:
                pieces.append(piece)
            elif piece in substitutions:
                pieces.append(substitutions[piece])
            else:
                pieces.append("${" + piece + "}")
        props["DefinitionString"] = {"Fn::Join": ["", pieces]}


def asl_placeholders(definition_text: str) -> set[str]:
    """The ${Name} placeholders of a definition (AWS pseudo parameters excluded)."""
    return {
        name
        for name in re.findall(r"\$\{([A-Za-z0-9_.:]+)\}", definition_text)
        if not name.startswith("AWS::")
    }


def gateway_responses(template: dict[str, Any]) -> dict[str, tuple[int | None, str]]:
    """The Api's GatewayResponses: type → (status code or None, application/json body template)."""
    props = template.get("Resources", {}).get("Api", {}).get("Properties", {})
    found = {}
    for response_type, response in (props.get("GatewayResponses") or {}).items():
        status = response.get("StatusCode")
        body = (response.get("ResponseTemplates") or {}).get("application/json")
        if body is not None:
            found[response_type] = (int(status) if status else None, body)
    return found
