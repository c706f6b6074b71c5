"""Patches over moto's Step Functions: its ASL interpreter (parsing, JSONPath, callback tokens,
stops, the name of a heartbeat lapse, aws-sdk parameters, the credentials it calls services with)
and its SendTaskFailure endpoint. Each docstring names the moto 5.2.5 behaviour it changes and
what AWS does instead; docs/emulator.md lists them with the test that pins each."""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from botocore.credentials import Credentials

    from relevo_local.identity import RoleSessions

# Boto service names whose AWS SDK integration parameters are mapped to the API's member names.
_CAMEL_CASE_SERVICES = frozenset({"stepfunctions"})


def parse_each_state_machine_definition_once() -> None:
    """moto 5.2.5 parses a state machine's ASL with its ANTLR grammar on every StartExecution, before
    the execution's first event: about 1 s for job.asl.json on this class of machine, which
    every job's handoff paid. The syntax tree depends on the definition text only, so it is
    parsed once per definition; the evaluation program is still built fresh from it for each
    execution (those components are per execution, the tree is only read). A definition with
    syntax errors is not cached and fails as before. Installed once, for the emulator running
    in this process.

    Measured gain (tests/helpers/emulator_patches.py, switched off and on between interleaved four-stage
    jobs on the shared 2-core machine, medians): 0.6 s of the emulator's CPU per job (1.4 s off,
    0.8 s on) and 2.3 s of a job's wall time."""
    from functools import lru_cache

    from antlr4 import CommonTokenStream, InputStream
    from moto.stepfunctions.parser.asl.antlr.runtime.ASLLexer import ASLLexer
    from moto.stepfunctions.parser.asl.antlr.runtime.ASLParser import ASLParser
    from moto.stepfunctions.parser.asl.parse import asl_parser
    from moto.stepfunctions.parser.asl.parse.preprocessor import Preprocessor

    parser_class = asl_parser.AmazonStateLanguageParser
    if getattr(parser_class, "_relevo_tree_cache", False):
        return

    @lru_cache(maxsize=32)
    def syntax_tree(definition: str) -> Any:
        errors = asl_parser.SyntaxErrorListener()
        parser = ASLParser(CommonTokenStream(ASLLexer(InputStream(definition))))
        parser.removeErrorListeners()
        parser.addErrorListener(errors)
        tree = parser.state_machine()
        if errors.errors:
            raise asl_parser.ASLParserException(errors=errors.errors)
        return tree

    def parse(definition: str) -> tuple[Any, Any]:
        tree = syntax_tree(definition)
        return Preprocessor().visit(tree), tree

    parser_class._relevo_original_parse = parser_class.__dict__["parse"]
    parser_class.parse = staticmethod(parse)
    parser_class._relevo_tree_cache = True


def parse_each_json_path_once() -> None:
    """moto 5.2.5's interpreter parses a JSONPath with jsonpath_ng on every evaluation
    (utils/json_path.extract_json for paths and intrinsic arguments, ResultPath for results), and
    jsonpath_ng builds a new ply lexer and parser for each: about a sixth of a busy test worker's
    CPU went there. A parsed path is an immutable expression tree that `find` and `update` only
    read, so each path text is parsed once. Installed once, for the emulator in this process.

    Measured gain (tests/helpers/emulator_patches.py, switched off and on between interleaved four-stage
    jobs on the shared 2-core machine, medians): 0.25 s of the emulator's CPU per job at 0.80 s
    (with 4,000 other items in the table: 0.13 s, each round's gain between 0.11 and 0.22 s)."""
    from functools import lru_cache

    from moto.stepfunctions.parser.asl.component.common.path import result_path
    from moto.stepfunctions.parser.asl.utils import json_path

    for module in (json_path, result_path):
        if not getattr(module.parse, "_relevo_cached", False):
            cached = lru_cache(maxsize=4096)(module.parse)
            cached._relevo_cached = True
            module.parse = cached


def name_heartbeat_timeouts() -> None:
    """A heartbeat lapse is reported as States.HeartbeatTimeout, as AWS names it.

    moto 5.2.5's Step Functions interpreter raises HeartbeatTimeoutError when a callback task's
    HeartbeatSeconds pass without SendTaskHeartbeat, but reports it as States.Timeout (the same
    failure as a TimeoutSeconds lapse), so a Catch on States.HeartbeatTimeout never matches there.
    AWS reports the lapse as States.HeartbeatTimeout ("Error handling in Step Functions", error
    names), and job.asl.json tells a lost lease from an exec timeout by exactly that name: the
    AwaitResult Catch on States.HeartbeatTimeout comes before the one on States.Timeout, and AWS
    scans catchers in order. Installed once per process."""
    from moto.stepfunctions.parser.api import HistoryEventType, TaskTimedOutEventDetails
    from moto.stepfunctions.parser.asl.component.common.error_name.failure_event import FailureEvent
    from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name import StatesErrorName
    from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name_type import (
        StatesErrorNameType,
    )
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_callback import (  # noqa: E501  # moto's module path alone is longer than a line
        StateTaskServiceCallback,
    )
    from moto.stepfunctions.parser.asl.eval.callback.callback import HeartbeatTimeoutError
    from moto.stepfunctions.parser.asl.eval.event.event_detail import EventDetails

    if getattr(StateTaskServiceCallback, "_relevo_heartbeat_timeout_named", False):
        return
    original = StateTaskServiceCallback._from_error

    def _from_error(self: Any, env: Any, ex: Exception) -> Any:
        if not isinstance(ex, HeartbeatTimeoutError):
            return original(self, env, ex)
        name = StatesErrorNameType.StatesHeartbeatTimeout
        return FailureEvent(
            env=env,
            error_name=StatesErrorName(typ=name),
            event_type=HistoryEventType.TaskTimedOut,
            event_details=EventDetails(  # type: ignore[typeddict-item]  # AWS sends one key
                taskTimedOutEventDetails=TaskTimedOutEventDetails(
                    resourceType=self._get_sfn_resource_type(),
                    resource=self._get_sfn_resource(),
                    error=name.to_name(),
                )
            ),
        )

    StateTaskServiceCallback._from_error = _from_error
    StateTaskServiceCallback._relevo_heartbeat_timeout_named = True


def map_aws_sdk_parameters_to_member_names() -> None:
    """`aws-sdk:sfn:*` task parameters. AWS reads an AWS SDK integration's parameters in PascalCase
    even where the service API is camelCase ("Parameters in Step Functions are expressed in
    PascalCase, even if the native service API is in camelCase", Step Functions Developer Guide,
    "Learning to use AWS service SDK integrations"): `sendTaskSuccess` takes `TaskToken` and
    `Output`. moto 5.2.5 hands the parameters to boto3 exactly as written
    (`StateTaskServiceAwsSdk` keeps the base `_normalise_parameters`, which does nothing), so
    `TaskToken` never reaches the request and the task fails with `States.Runtime: 'TaskToken'`,
    while the camelCase spelling AWS would refuse works. The interpreter already carries the
    mapping (`StateTaskService._to_boto_request`, by the operation's input shape): it is applied to
    the Step Functions API, the one AWS SDK service the state machine calls whose members are not
    PascalCase. DynamoDB's members are PascalCase already and are left as they are."""
    from botocore import xform_name
    from botocore.session import get_session
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_aws_sdk import (  # noqa: E501  # moto's module path alone is longer than a line
        StateTaskServiceAwsSdk,
    )

    if getattr(StateTaskServiceAwsSdk, "_relevo_pascal_case_parameters", False):
        return
    original = StateTaskServiceAwsSdk._normalise_parameters
    session = get_session()

    def _normalise_parameters(
        self: Any,
        parameters: dict,
        boto_service_name: str | None = None,
        service_action_name: str | None = None,
    ) -> None:
        service = self._get_boto_service_name(boto_service_name)
        if service in _CAMEL_CASE_SERVICES:
            action = self._get_boto_service_action(service_action_name)
            model = session.get_service_model(service)
            operation = next((name for name in model.operation_names if xform_name(name) == action), None)
            if operation is not None:
                self._to_boto_request(parameters, model.operation_model(operation).input_shape)
        original(self, parameters, boto_service_name, service_action_name)

    StateTaskServiceAwsSdk._normalise_parameters = _normalise_parameters
    StateTaskServiceAwsSdk._relevo_pascal_case_parameters = True


def end_a_stopped_execution_aborted() -> None:
    """A stop during a `.waitForTaskToken` task. AWS ends a stopped execution ABORTED at once
    (StopExecution: "Stops an execution"; its status becomes ABORTED). moto 5.2.5 marks the program
    stopped but lets a task waiting for its token wait on until its TimeoutSeconds, and the task's
    timeout then fails the execution (`Environment.set_error` replaces the stopped state), so it
    ends FAILED. Job executions park in such a task while they wait for their project
    (WaitForProject), so stopping a waiting job would end it FAILED, minutes later. Here a stop
    interrupts the execution's waits for a token, and an error raised after the stop leaves it
    stopped: ABORTED, as on AWS."""
    from moto.stepfunctions.parser.asl.eval.environment import Environment
    from moto.stepfunctions.parser.asl.eval.program_state import ProgramStopped

    if getattr(Environment, "_relevo_stop_aborts", False):
        return
    set_error, set_stop = Environment.set_error, Environment.set_stop

    def set_error_unless_stopped(self: Any, error: Any) -> None:
        if isinstance(self._program_state, ProgramStopped):
            return
        set_error(self, error)

    def set_stop_and_interrupt_waits(self: Any, stop_date: Any, cause: str | None, error: str | None) -> None:
        set_stop(self, stop_date, cause, error)
        for endpoint in list(self.callback_pool_manager._pool.values()):
            endpoint.interrupt_all()

    Environment.set_error = set_error_unless_stopped
    Environment.set_stop = set_stop_and_interrupt_waits
    Environment._relevo_stop_aborts = True


def take_the_token_before_the_wait() -> None:
    """Both answers in the window between a callback token's start and its heartbeat clock's.

    A heartbeat that comes before the task's wait. AWS generates a callback task's token "in the
    context object when a workflow enters a task state" (SendTaskHeartbeat, Step Functions API
    Reference), and the token answers SendTaskHeartbeat from then on. moto 5.2.5 registers the token
    before the task's service call, but sets up the heartbeat clock only once the call has returned
    and the wait begins; a heartbeat in between (the agent reads the run token AwaitResult's
    updateItem wrote, and heartbeats at once) finds no clock, is counted as no match, and answers
    InvalidToken, which an agent takes for a task that no longer waits. Here such a heartbeat is
    taken: the clock it would reset has not started.

    An answer that comes before the task's wait. In that same window, SendTaskSuccess or
    SendTaskFailure (an agent whose command ends at once, or a test failing a stage as soon as it
    reads the run token) is stored on the callback, but the heartbeat clock, set up afterwards,
    never hears of it: moto 5.2.5's heartbeat wait looks at the answer only when a heartbeat
    arrives, so the task waited out its HeartbeatSeconds, ended States.HeartbeatTimeout, and the
    stage was retried as a lost lease: its effect ran twice on the emulator where AWS takes the
    answer (the token is live from the task's start). Here a heartbeat clock set up after an answer
    starts already woken, so the wait takes the answer."""
    from moto.stepfunctions.parser.asl.eval.callback.callback import CallbackEndpoint

    if getattr(CallbackEndpoint, "_relevo_token_before_the_wait", False):
        return
    notify_heartbeat, setup_heartbeat_endpoint = (
        CallbackEndpoint.notify_heartbeat,
        CallbackEndpoint.setup_heartbeat_endpoint,
    )

    def notify_heartbeat_or_take_it_early(self: Any) -> bool:
        if self._heartbeat_endpoint is None and self.get_outcome() is None:
            return True  # the token is live; its heartbeat clock starts with the wait
        return notify_heartbeat(self)

    def setup_heartbeat_endpoint_woken_by_an_early_answer(self: Any, heartbeat_seconds: int) -> Any:
        heartbeats = setup_heartbeat_endpoint(self, heartbeat_seconds=heartbeat_seconds)
        # notify() stores the answer before it looks for a clock, and this sets the clock before it
        # looks for an answer: whichever runs second sees the other, so no answer goes unheard.
        if self.get_outcome() is not None:
            heartbeats.notify()
        return heartbeats

    CallbackEndpoint.notify_heartbeat = notify_heartbeat_or_take_it_early
    CallbackEndpoint.setup_heartbeat_endpoint = setup_heartbeat_endpoint_woken_by_an_early_answer
    CallbackEndpoint._relevo_token_before_the_wait = True


def close_a_callback_when_its_wait_ends() -> None:
    """A token whose task has ended. On AWS, SendTaskSuccess, SendTaskFailure and SendTaskHeartbeat
    with the token of a task that timed out (TimeoutSeconds, HeartbeatSeconds) or already ended are
    refused with TaskTimedOut ("Provided task does not exist anymore"; SendTaskSuccess, Step
    Functions API Reference, Errors). moto 5.2.5 keeps the task's callback open after its wait ends
    and takes an answer to it silently, so an agent answering the dispatch of a queue wait that ran
    out (a pause holds the stage and sends it again with a new token) was told its claim was taken
    and ran the stage, which on AWS is refused. Here a task's callback closes when its wait ends,
    whatever ended it, and a later answer to it is refused: moto answers TaskDoesNotExist there (it
    tests the type of the wrapper, not of the error it wraps) where AWS says TaskTimedOut; the agent
    takes both, and InvalidToken, as a dispatch that no longer waits. moto 5.2.5's own TaskTimedOut
    and TaskDoesNotExist cannot be raised as they are (they take no message, where their base class
    needs one, and name no error type), which answered HTTP 500: they get AWS's error type and a
    default message."""
    from moto.stepfunctions.parser.api import TaskDoesNotExist, TaskTimedOut
    from moto.stepfunctions.parser.asl.eval.callback.callback import CallbackConsumerTimeout, CallbackEndpoint

    if getattr(CallbackEndpoint, "_relevo_closes", False):
        return
    for error, message in (
        (TaskTimedOut, "Task Timed Out: 'Provided task does not exist anymore'"),
        (TaskDoesNotExist, "Task Does Not Exist: 'Provided task does not exist'"),
    ):
        error.TYPE = error.code

        def __init__(self: Any, message: str = message) -> None:
            type(self).__mro__[1].__init__(self, message)  # type: ignore[misc]  # the error class's own base

        error.__init__ = __init__
    interrupt_all = CallbackEndpoint.interrupt_all

    def interrupt_all_and_close(self: Any) -> None:
        # The task's wait ended (an outcome, a timeout, a stop): every later answer is refused.
        if self.consumer_error is None:
            self.consumer_error = CallbackConsumerTimeout()
        interrupt_all(self)

    CallbackEndpoint.interrupt_all = interrupt_all_and_close
    CallbackEndpoint._relevo_closes = True


def pass_on_the_cause_of_a_task_failure() -> None:
    """The cause of SendTaskFailure. AWS hands a failed callback task's `cause` to its Catch with the
    error ("SendTaskFailure", Step Functions API Reference: cause, "A more detailed explanation of
    the cause of the failure"; a catcher's output is {Error, Cause}). moto 5.2.5's endpoint reads
    only `error` (StepFunctionResponse.send_task_failure), so every catcher saw an empty cause: the
    job's error said "no cause was reported" where the agent had said why (a checkout's missing
    commit, an exit code). Here the endpoint passes the cause on."""
    from moto.stepfunctions.responses import EmptyResult, StepFunctionResponse

    if getattr(StepFunctionResponse, "_relevo_task_failure_cause", False):
        return

    def send_task_failure(self: Any) -> Any:
        # The interpreter's backend (StepFunctionsParserBackend) takes the cause; moto's plain one has no
        # executions to tell.
        self.stepfunction_backend.send_task_failure(
            self._get_param("taskToken"), error=self._get_param("error"), cause=self._get_param("cause")
        )
        return EmptyResult()

    StepFunctionResponse.send_task_failure = send_task_failure
    StepFunctionResponse._relevo_task_failure_cause = True


def run_interpreter_as_execution_role(sessions: RoleSessions) -> None:
    """moto 5.2.5's Step Functions interpreter calls every integrated service with the fixed key
    `ak`/`sk` (moto/stepfunctions/parser/asl/utils/boto_client.py), which enforcement refuses. On
    AWS a state machine calls them as its execution role, whose policy then decides: the client
    is built with that role's session instead (same endpoint, same timeouts, no retries).
    Installed once per process, with the first stack's `sessions`."""
    from moto.stepfunctions.parser.asl.utils import boto_client

    if getattr(boto_client.boto_client_for, "_relevo_execution_role", False):
        return
    import boto3
    from botocore.config import Config
    from moto.settings import moto_server_port
    from moto.stepfunctions.parser.asl.component.common.timeouts.timeout import TimeoutSeconds

    original = boto_client.boto_client_for
    # moto builds a new client for every task state it runs. Building one copies botocore's
    # event emitter and loads the service model: tens of milliseconds holding the GIL, for each
    # state of each execution. A client is safe to share between threads, so one per service and
    # role session is built and kept (a renewed session gets its own).
    clients: dict[tuple[str, str, str], Any] = {}
    clients_lock = threading.Lock()

    def boto_client_for(region: str, service: str, state_credentials: Any = None) -> Any:
        if state_credentials is None:
            raise RuntimeError(
                f"the Step Functions interpreter called {service} without the execution's role"
            )
        credentials = sessions.credentials(
            state_credentials.role_arn, "states.amazonaws.com", "relevo-execution"
        )
        cache_key = (region, service, credentials.access_key)
        with clients_lock:
            if cache_key not in clients:
                clients[cache_key] = _interpreter_client(region, service, credentials)
            return clients[cache_key]

    def _interpreter_client(region: str, service: str, credentials: Credentials) -> Any:
        return boto3.client(  # type: ignore[call-overload]  # any service by name
            service_name=service,
            region_name=region,
            endpoint_url=f"http://localhost:{moto_server_port()}",
            aws_access_key_id=credentials.access_key,
            aws_secret_access_key=credentials.secret_key,
            aws_session_token=credentials.token,
            config=Config(
                parameter_validation=False,
                retries={"max_attempts": 0, "total_max_attempts": 1},
                # Shared by every execution running at once (each holds a connection per call).
                max_pool_connections=64,
                connect_timeout=TimeoutSeconds.DEFAULT_TIMEOUT_SECONDS,
                read_timeout=TimeoutSeconds.DEFAULT_TIMEOUT_SECONDS,
            ),
        )

    boto_client_for._relevo_execution_role = True
    boto_client.boto_client_for = boto_client_for
    # The service modules imported the function by name: rebind it where they hold it.
    for module in list(sys.modules.values()):
        if module is not None and getattr(module, "boto_client_for", None) is original:
            module.boto_client_for = boto_client_for
