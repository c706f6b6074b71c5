"""`relevo local up`: the whole cloud side of Relevo inside an embedded AWS emulator.

moto runs in server mode on 127.0.0.1 with its Step Functions interpreter on and its IAM
enforcement on; template.yaml is deployed through moto's CloudFormation after the same
transforms `sam deploy` applies; API routes are served by the local API Gateway stand-in; each
function runs from the layer as `sam build` makes it, under the Lambda runtime's Python when
this machine has one, with its own execution role's credentials (see lambda_runtime.py and
identity.py). The API's IAM authentication is api_auth.py's; the streams and schedules the
emulator keeps but never invokes Lambda from are event_sources.py's. Every patch over moto is in
relevo_local.moto, applied by its install().
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import boto3
import requests
from botocore.credentials import Credentials

from relevo_core.files.private import write_private
from relevo_core.files.stack import LocalCredentials, StackInfo
from relevo_local import deferred, heap, identity, lambda_layer, template
from relevo_local import moto as moto_patches
from relevo_local.api_auth import IamAuthentication
from relevo_local.apigateway import ApiAdapter, Route
from relevo_local.event_sources import EventSources
from relevo_local.lambda_runtime import FunctionRuntime, FunctionSpec, TraceDaemonSocket
from relevo_local.scheduler import ScheduleFirer
from relevo_local.streams import StreamPoller

REPO_ROOT = Path(__file__).resolve().parents[2]
ACCOUNT_ID = identity.ACCOUNT_ID
# The key the emulator accepts before its IAM enforcement is on: only for creating the stack's
# own IAM user, the first request the stack makes.
_BOOTSTRAP_CREDENTIALS: dict[str, Any] = {
    "aws_access_key_id": "bootstrap",
    "aws_secret_access_key": "bootstrap",
}


def region_logical_suffix(region_affinity: str) -> str:
    """How Fn::ForEach's &{Region} turns an affinity into a logical-id suffix."""
    return re.sub(r"[^0-9a-zA-Z]+", "", region_affinity)


class LocalStack:
    def __init__(
        self,
        state_dir: Path,
        stack_name: str = "relevo",
        region: str = "us-east-1",
        parameters: dict[str, str] | None = None,
        root: Path = REPO_ROOT,
        host: str = "127.0.0.1",
        api_port: int = 0,
        moto_port: int = 0,
        schedule_poll_sec: float = 5.0,
        rule_schedules: bool = True,
        project_schedules: bool = True,
    ) -> None:
        # Absolute: function processes run in their own working directories and find their
        # layers under it (a relative --state-dir, as `relevo local up` defaults to, would not resolve).
        self.state_dir = Path(state_dir).resolve()
        self.stack_name = stack_name
        self.region = region
        self.parameters = dict(parameters or {})
        self.root = root
        self.host = host
        self.api_port = api_port
        self.moto_port = moto_port
        # How often project schedules (EventBridge Scheduler) are checked for a due slot.
        self.schedule_poll_sec = schedule_poll_sec
        # Timers for the template's own EventBridge rules (the sweeper's minute). A test session
        # turns them off: its tests run the sweep themselves, with their own clock, and a sweep
        # from a timer would race what they assert.
        self.rule_schedules = rule_schedules
        # The same for project schedules (EventBridge Scheduler): a rate(1 minute) schedule one
        # test registers would otherwise enqueue a job every minute into every later test's stack.
        self.project_schedules = project_schedules
        self.schedule_firer: ScheduleFirer | None = None
        self.stream_pollers: list[StreamPoller] = []
        self._server: Any = None
        self._runtimes: dict[str, FunctionRuntime] = {}
        self._adapter: ApiAdapter | None = None
        self.info: StackInfo | None = None
        self._stopping = threading.Event()
        self._heap_held = False
        self.credentials: Credentials | None = None
        self.lambda_python: lambda_layer.LambdaPython | None = None
        self.role_sessions = identity.RoleSessions(region)
        self.trace_daemon: TraceDaemonSocket | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> StackInfo:
        for name in ("moto", "werkzeug", "botocore", "urllib3"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
        moto_patches.install(self.role_sessions)
        from moto.moto_server.threaded_moto_server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address=self.host, port=self.moto_port, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        # The Step Functions interpreter calls back into the server on MOTO_PORT. A process may
        # run a second stack (e2e modules beside the test session's): stop() gives it back.
        self._previous_moto_port = os.environ.get("MOTO_PORT")
        os.environ["MOTO_PORT"] = str(port)
        # The SAM translator reads the region from the environment.
        os.environ["AWS_DEFAULT_REGION"] = self.region
        requests.post(
            f"{endpoint}/moto-api/config", json={"stepfunctions": {"execute_state_machine": True}}, timeout=10
        ).raise_for_status()
        bootstrap = boto3.session.Session(**_BOOTSTRAP_CREDENTIALS, region_name=self.region)
        self.credentials = identity.local_user(bootstrap.client("iam", endpoint_url=endpoint))
        identity.enforce(endpoint)
        session = boto3.session.Session(
            aws_access_key_id=self.credentials.access_key,
            aws_secret_access_key=self.credentials.secret_key,
            region_name=self.region,
        )
        self._session = _EndpointSession(session, endpoint)
        self.info = self._deploy(endpoint)
        # No full collection walks the deployed emulator while it runs (relevo_local.heap).
        heap.hold()
        self._heap_held = True
        return self.info

    def stop(self) -> None:
        self._stopping.set()
        if self._adapter:
            self._adapter.stop()
        # Every function's environments are told to end at once, then share one grace period.
        stopping = [(runtime, runtime.begin_stop()) for runtime in self._runtimes.values()]
        deadline = time.monotonic() + 2
        for runtime, idle in stopping:
            runtime.finish_stop(idle, deadline)
        if self._server:
            self._server.stop()
        if self.trace_daemon:
            self.trace_daemon.close()
        if self._heap_held:
            self._heap_held = False
            heap.release()
        previous = getattr(self, "_previous_moto_port", None)
        if previous is None:
            os.environ.pop("MOTO_PORT", None)
        else:
            os.environ["MOTO_PORT"] = previous

    # ------------------------------------------------------------------ deploy
    def _deploy(self, endpoint: str) -> StackInfo:
        sam = template.load_sam_template(self.root / "template.yaml", self.parameters)
        bucket = f"{self.stack_name}-local-deployment"
        s3 = self._session.client("s3")
        s3.create_bucket(Bucket=bucket)
        packaged = template.package(sam, self.root, s3, bucket)
        pseudo = {
            "AWS::StackName": self.stack_name,
            "AWS::Region": self.region,
            "AWS::AccountId": ACCOUNT_ID,
            "AWS::Partition": "aws",
        }
        cfn = template.translate(packaged, {**self.parameters, **pseudo}, self._session.client("iam"))
        template.fold_definition_substitutions(cfn)
        from moto.cloudformation.parsing import get_model_map

        cfn, later, not_emulated = deferred.split(cfn, set(get_model_map()))

        cloudformation = self._session.client("cloudformation")
        # moto 5.2.5 splits a list-typed parameter (CommaDelimitedList) only when it is passed,
        # not when it takes its Default (`!Join [",", !Ref List]` would then join characters):
        # pass those defaults explicitly, as CloudFormation resolves them.
        list_defaults = {
            name: str(slot["Default"])
            for name, slot in cfn.get("Parameters", {}).items()
            if "List" in str(slot.get("Type", "")) and "Default" in slot and name not in self.parameters
        }
        cloudformation.create_stack(
            StackName=self.stack_name,
            TemplateBody=json.dumps(cfn),
            Parameters=[
                {"ParameterKey": k, "ParameterValue": v}
                for k, v in {**list_defaults, **self.parameters}.items()
            ],
            Capabilities=["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM", "CAPABILITY_AUTO_EXPAND"],
        )
        stack = _wait_for_stack(cloudformation, self.stack_name)
        outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}
        physical: dict[str, str | None] = {}
        paginator = cloudformation.get_paginator("list_stack_resources")
        for page in paginator.paginate(StackName=self.stack_name):
            for summary in page["StackResourceSummaries"]:
                physical[summary["LogicalResourceId"]] = summary["PhysicalResourceId"]
        physical.update(deferred.create(self._session, self.stack_name, later, outputs))
        self._register_state_machines_with_interpreter(cfn, physical)
        for logical_id in not_emulated:
            physical[logical_id] = None
        self._fill_layer_arns(sam, cfn, physical)

        self._start_functions(sam, physical)
        api_id = str(physical.get("Api") or "local")
        stage = sam["Resources"].get("Api", {}).get("Properties", {}).get("StageName", "v1")
        routes = [
            Route.of(method, path, iam, fn.logical_id)
            for fn in template.sam_functions(sam, self.root)
            for method, path, iam in fn.routes
        ]
        self._adapter = ApiAdapter(
            routes,
            invoke=lambda name, event: self._runtimes[name].invoke(event),
            authenticate=IamAuthentication(self._session.endpoint, self.region, api_id, stage),
            stage=stage,
            api_id=str(api_id),
            account_id=ACCOUNT_ID,
            host=self.host,
            port=self.api_port,
            gateway_responses=template.gateway_responses(sam),
        )
        self._adapter.start()
        moto_patches.cloudformation.point_api_url_output_at_the_adapter(
            self.stack_name, self.region, self._adapter.url
        )
        sources = EventSources(self.root, self._runtimes, self._stopping, self.region, self.stack_name)
        self.stream_pollers.extend(
            sources.start_streams(
                self._session.client("dynamodb"), self._session.client("dynamodbstreams"), sam, physical
            )
        )
        if self.rule_schedules:
            sources.start_schedules(sam)
        if self.project_schedules:
            self.schedule_firer = sources.start_project_schedules(
                self._session.client("scheduler"),
                [str(physical[d.logical_id]) for d in later if d.type == "AWS::Scheduler::ScheduleGroup"],
                self.schedule_poll_sec,
            )

        regions = self.parameters.get("RegionAffinities") or sam["Parameters"]["RegionAffinities"]["Default"]
        work_queues = {
            region: str(physical[f"WorkQueue{region_logical_suffix(region)}"])
            for region in [r.strip() for r in str(regions).split(",") if r.strip()]
        }
        assert self.credentials is not None  # the local user, made as the stack started
        info = StackInfo(
            stack_name=self.stack_name,
            aws_endpoint=endpoint,
            api_url=self._adapter.url,
            region=self.region,
            resources=dict(sorted(physical.items())),
            work_queues=work_queues,
            not_emulated=not_emulated,
            local_credentials=LocalCredentials(
                access_key_id=self.credentials.access_key, secret_access_key=self.credentials.secret_key
            ),
            agent_credentials=self._agent_sessions(physical, work_queues),
            agent_roles={
                region: outputs[f"AgentRoleArn{region_logical_suffix(region)}"]
                for region in work_queues
                if f"AgentRoleArn{region_logical_suffix(region)}" in outputs
            },
        )
        # It holds the emulator's access keys: readable by this user only (relevo_core.files.private).
        write_private(self.state_dir / "stack.json", json.dumps(info.model_dump(), indent=2) + "\n")
        return info

    def _agent_sessions(
        self, physical: dict[str, str | None], work_queues: dict[str, str]
    ) -> dict[str, LocalCredentials]:
        """For each region affinity, a session of its agent role, taken as a Mac takes it (an IAM
        principal of the account calls sts:AssumeRole; the role's trust policy allows it)."""
        sts, iam = self._session.client("sts"), self._session.client("iam")
        sessions = {}
        for region in work_queues:
            role = iam.get_role(RoleName=str(physical[f"AgentRole{region_logical_suffix(region)}"]))["Role"][
                "Arn"
            ]
            issued = sts.assume_role(
                RoleArn=role, RoleSessionName=f"relevo-agent-{region}", DurationSeconds=43200
            )["Credentials"]
            sessions[region] = LocalCredentials(
                access_key_id=issued["AccessKeyId"],
                secret_access_key=issued["SecretAccessKey"],
                session_token=issued["SessionToken"],
            )
        return sessions

    def _register_state_machines_with_interpreter(
        self, cfn: dict[str, Any], physical: dict[str, str | None]
    ) -> None:
        """moto 5.2.5 keeps two Step Functions backends: its CloudFormation creates state machines
        in the plain one, while with execute_state_machine on the API serves (and executes) only
        the interpreter's. Register each stack-created machine, as CloudFormation resolved it,
        with the interpreter through the public API, under the same name and hence the same ARN."""
        from moto.stepfunctions.models import stepfunctions_backends

        plain = stepfunctions_backends[ACCOUNT_ID][self.region]
        sfn = self._session.client("stepfunctions")
        for logical_id, resource in cfn["Resources"].items():
            if resource["Type"] != "AWS::StepFunctions::StateMachine":
                continue
            machine = plain.describe_state_machine(str(physical[logical_id]))
            created = sfn.create_state_machine(
                name=machine.name,
                definition=machine.definition,
                roleArn=machine.roleArn,
                type=resource["Properties"].get("StateMachineType", "STANDARD"),
            )
            if created["stateMachineArn"] != machine.arn:
                raise RuntimeError(
                    f"{logical_id}: interpreter ARN {created['stateMachineArn']} != {machine.arn}"
                )

    def _fill_layer_arns(
        self, sam: dict[str, Any], cfn: dict[str, Any], physical: dict[str, str | None]
    ) -> None:
        """SAM renames a layer to a content-hashed logical id, and the emulator reports no
        physical id for it: name both by the layer version's ARN."""
        lambda_client = self._session.client("lambda")
        for logical_id, resource in sam["Resources"].items():
            if resource["Type"] != "AWS::Serverless::LayerVersion":
                continue
            versions = [
                k
                for k, r in cfn["Resources"].items()
                if k.startswith(logical_id) and r["Type"] == "AWS::Lambda::LayerVersion"
            ]
            names = {cfn["Resources"][v]["Properties"].get("LayerName", v) for v in versions}
            arn = None
            for layer in lambda_client.list_layers().get("Layers", []):
                # The emulator names a stack's layer <stack>-<logical id>-<suffix>.
                if layer["LayerName"] in names or any(f"-{v}-" in layer["LayerName"] for v in versions):
                    arn = layer["LatestMatchingVersion"]["LayerVersionArn"]
            physical[logical_id] = arn
            for version in versions:
                physical[version] = arn

    def _start_functions(self, sam: dict[str, Any], physical: dict[str, str | None]) -> None:
        """Every function as Lambda runs it: the layers built as `sam build` builds them, the
        runtime's Python, the function's configuration as deployed, its role's credentials."""
        lambda_client = self._session.client("lambda")
        runtime = sam.get("Globals", {}).get("Function", {}).get("Runtime", "python3.12")
        self.lambda_python = lambda_layer.find_lambda_python(runtime)
        build_dir = self.state_dir / "build"
        layer_dirs = [
            lambda_layer.build_layer(
                (self.root / resource["Properties"]["ContentUri"]).resolve(),
                self.lambda_python,
                build_dir / logical_id,
            )
            for logical_id, resource in sam["Resources"].items()
            if resource["Type"] == "AWS::Serverless::LayerVersion"
        ]
        runtime_dir = lambda_layer.runtime_packages(self.lambda_python)
        logs = self.state_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.trace_daemon = TraceDaemonSocket()
        for fn in template.sam_functions(sam, self.root):
            config = lambda_client.get_function_configuration(FunctionName=str(physical[fn.logical_id]))
            name, role = config["FunctionName"], config["Role"]
            spec = FunctionSpec(
                name=name,
                arn=config["FunctionArn"],
                code_dir=fn.code_dir,
                layer_dirs=layer_dirs,
                runtime_dir=runtime_dir,
                handler=fn.handler,
                environment=config.get("Environment", {}).get("Variables", {}),
                memory_mb=int(config.get("MemorySize", 512)),
                timeout_sec=float(config.get("Timeout", 3)),
                log_file=logs / f"{fn.logical_id}.log",
                # Lambda assumes the execution role for each environment.
                credentials=lambda role=role, name=name: self.role_sessions.credentials(
                    role, "lambda.amazonaws.com", name
                ),
                extra_env={
                    "AWS_ENDPOINT_URL": self._session.endpoint,
                    "AWS_REGION": self.region,
                    "AWS_DEFAULT_REGION": self.region,
                    **self.trace_daemon.environment(),
                },
            )
            self._runtimes[fn.logical_id] = FunctionRuntime(spec, self.lambda_python)
        for runtime_of_function in self._runtimes.values():
            runtime_of_function.wait_ready()
        failed = {name: rt.init_error for name, rt in self._runtimes.items() if rt.init_error}
        if failed:
            raise RuntimeError(
                "functions fail at cold start with only their code, layers and the runtime's boto3 "
                "importable: "
                + "; ".join(
                    f"{name}: {error['errorType']}: {error['errorMessage']}"
                    for name, error in sorted(failed.items())
                )
            )


class _EndpointSession:
    """A boto3 session whose clients all talk to the emulator."""

    def __init__(self, session: boto3.session.Session, endpoint: str) -> None:
        self._session = session
        self.endpoint = endpoint

    def client(self, service: str) -> Any:
        # boto3-stubs type client() per literal service name.
        endpoint = self.endpoint
        return self._session.client(service, endpoint_url=endpoint)  # type: ignore[call-overload]  # by name


def _wait_for_stack(cloudformation: Any, name: str, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        stack = cloudformation.describe_stacks(StackName=name)["Stacks"][0]
        status = stack["StackStatus"]
        if status.endswith("_COMPLETE") and "ROLLBACK" not in status:
            return stack
        if "FAILED" in status or "ROLLBACK" in status:
            reasons = [
                f"{e['LogicalResourceId']}: {e.get('ResourceStatusReason')}"
                for e in cloudformation.describe_stack_events(StackName=name)["StackEvents"]
                if "FAILED" in e["ResourceStatus"]
            ]
            raise RuntimeError(f"stack {name} ended {status}: {'; '.join(reasons) or 'no reason given'}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"stack {name} still {status} after {timeout}s")
        time.sleep(0.2)
