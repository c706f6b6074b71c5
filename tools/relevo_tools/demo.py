"""`make demo`: the whole product on the embedded local stack, in a few minutes.

`relevo local up` with three regions (eu-west, us-east with two real relevo-agent processes
each, ap-south with three) and the seven projects of examples/demo/. Once every agent is online,
seven scenarios run side by side (caches after shards), each on its own project so none waits for
another's lock (relevo_tools.demo_release, relevo_tools.demo_scenarios, relevo_tools.demo_tests,
relevo_tools.demo_caches; what they share: demo_harness):

  release   a signed GitHub push, the same delivery again (a duplicate), five stages with an
            approval gate before deploy, approved through `relevo job approve`; its upload and
            notarize stages are the built-in app_store_upload and notarization effects, sent to
            the local Apple service (App Store Connect and the notary service on this machine)
  retry     exit 75 on attempt 1, retried on the region's other agent
  dlq       a non-retryable failure, dead-lettered, then `relevo dlq redrive` from the failed
            stage under the same idempotency key
  kill      the agent running an app_store_upload is SIGKILLed once Apple has the bytes; its lease
            expires and the other agent reconciles the attempt with the kind's probe: one upload
  shards    a build, then its test stage as three shards over the three ap-south Macs, each
            restoring the build's products through the handoff
  tests     a real project's tests (more-itertools' test_more.py) in 4 shards over the us-east
            Macs, twice: split by count, then by the times the first job measured; every test
            accounted once through the API, and the job's Tests tab named
  caches    after shards, on the ap-south Macs: a pip install into .venv with a cache keyed on the
            lock file, twice: a miss and a save on one Mac, then a hit on another (its labels)

It ends with a summary (jobs, outcomes, retries, handoff latency, DLQ entries, one row per
scenario) and exits 0 only if every scenario held. Everything it started is stopped, pass or fail.
"""

from __future__ import annotations

import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import tomllib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from rich.table import Table

from relevo_cli.projects import apply_project_file
from relevo_local.apple.connect_state import Timing
from relevo_local.apple.provision import LocalApple, start_local_apple
from relevo_local.peer_suite import suite
from relevo_local.processes import agent_process, local_stack, write_agent_config
from relevo_local.recorder import Recorder
from relevo_tools.demo_caches import SCENARIO as CACHES_SCENARIO
from relevo_tools.demo_caches import scenario_dep_cache, wheels
from relevo_tools.demo_harness import (
    AGENT_SETTINGS,
    CAPACITY,
    FLEET,
    LABELS,
    PROJECTS,
    ROOT,
    Demo,
    ScenarioResult,
    console,
    elapsed,
    guarded,
    restart_clock,
    say,
    seconds_between,
)
from relevo_tools.demo_release import (
    add_apple_apps,
    check_out_release_from,
    release_repository,
    report_release_to,
    scenario_release,
    use_local_apple,
)
from relevo_tools.demo_scenarios import (
    FLEET_SCENARIO,
    RETRY_SCENARIO,
    scenario_dlq,
    scenario_fleet,
    scenario_kill,
    scenario_retry,
    scenario_shards,
)
from relevo_tools.demo_tests import SCENARIO as TESTS_SCENARIO
from relevo_tools.demo_tests import scenario_peer_tests


def percentile(values: list[float], share: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def agents_used(job: dict[str, Any]) -> list[str]:
    """The agents of a job's attempts, failed ones first, in order of first use."""
    failed = [entry["agent"] for s in job["stages"] for entry in s["attempts_log"]]
    final = [s["agent_id"] for s in job["stages"]]
    return [agent for agent in dict.fromkeys(failed + final) if agent]


def handoff_latencies(jobs: list[dict[str, Any]]) -> list[float]:
    """Dispatch → claim of every claimed stage: the job view keeps each stage's latest attempt."""
    latencies = (seconds_between(s["dispatched_at"], s["started_at"]) for job in jobs for s in job["stages"])
    return [latency for latency in latencies if latency is not None]


def jobs_table(jobs: list[dict[str, Any]]) -> Table:
    mark = {"succeeded": "✓", "warning": "⚠", "failed": "✗", "skipped": "–", "canceled": "⊘"}
    table = Table(title="Jobs", title_justify="left")
    for column in ("job", "project", "region", "trigger", "status", "stages", "retries", "agents"):
        # A job id is never cut: the stages and agents columns wrap first.
        table.add_column(column, no_wrap=column == "job", min_width=30 if column == "job" else None)
    for job in jobs:
        table.add_row(
            job["job_id"],
            job["project"],
            job["region_affinity"],
            job["trigger"]["type"],
            job["status"],
            " ".join(f"{s['name']}{mark.get(s['status'], '·')}" for s in job["stages"]),
            str(sum(s["retry_count"] or 0 for s in job["stages"])),
            ", ".join(agents_used(job)),
        )
    return table


def totals_table(jobs: list[dict[str, Any]], dead_letters: list[dict[str, Any]]) -> Table:
    by_status: dict[str, int] = {}
    for job in jobs:
        by_status[job["status"]] = by_status.get(job["status"], 0) + 1
    retries = sum(s["retry_count"] or 0 for job in jobs for s in job["stages"])
    handoffs = handoff_latencies(jobs)
    table = Table(title="Summary", title_justify="left", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("jobs", str(len(jobs)))
    table.add_row("outcomes", ", ".join(f"{n} {status}" for status, n in sorted(by_status.items())))
    table.add_row("retries", f"{retries} (stage attempts after a failed one)")
    table.add_row(
        "handoff latency",
        f"p50 {percentile(handoffs, 0.5):.2f}s · p95 {percentile(handoffs, 0.95):.2f}s "
        f"(dispatch → claim, {len(handoffs)} stage claims)"
        if handoffs
        else "no claims",
    )
    entries = [f"{e['job_id']} {e['project']} {e['error']}: {e['state']}" for e in dead_letters]
    table.add_row("DLQ entries", "\n".join([str(len(dead_letters)), *entries]))
    return table


def summary(demo: Demo, outcomes: list[ScenarioResult]) -> bool:
    """Print the jobs, the totals and one row per scenario; True when every scenario held."""
    jobs = [demo.api.get_job(job_id) for job_id in demo.job_ids]
    console.print(jobs_table(jobs))
    console.print(totals_table(jobs, demo.api.dead_letters()["entries"]))
    scenarios = Table(title="Scenarios", title_justify="left")
    for column in ("", "scenario", "evidence"):
        scenarios.add_column(column)
    for outcome in outcomes:
        scenarios.add_row(
            "[green]✓[/green]" if outcome.ok else "[red]✗[/red]",
            outcome.scenario,
            "\n".join(outcome.evidence),
        )
    console.print(scenarios)
    return all(outcome.ok for outcome in outcomes)


# ------------------------------------------------------------------------------------ main
def agent_environment(shared: Path) -> dict[str, str]:
    """What the demo's stage commands read: its shared directory, and the tree-digest tool with
    the Python to run it (so that each side of the handoff computes its own digest); the peer
    project whose tests peer-tests shards; the wheels dep-cache's step installs."""
    return {
        "RELEVO_DEMO_DIR": str(shared),
        "RELEVO_DEMO_PYTHON": sys.executable,
        "RELEVO_DEMO_TOOLS": str(PROJECTS / "tools"),
        "RELEVO_DEMO_PEER_SUITE": str(suite()),
        "RELEVO_DEMO_WHEELS": str(wheels()),
    }


# Apple's processing of an upload (its upload, then its build) and a notarization's review, in
# seconds: long enough that the kill scenario's agent dies while Apple is still at it, short enough
# that the release waits only a few seconds for each.
APPLE_TIMING = Timing(upload_processing_sec=1.0, build_processing_sec=3.0)
APPLE_REVIEW_SEC = 3.0


def release_endpoints(apple: LocalApple) -> dict[str, Any]:
    """The agents' [release_endpoints]: the local Apple service, asked again every second while an
    effect waits (its processing and review take seconds, Apple's minutes)."""
    table: dict[str, Any] = tomllib.loads(apple.agent_config())["release_endpoints"]
    return {**table, "poll_sec": 1}


def start_fleet(
    demo_stack: ExitStack, work: Path, stack_file: Path, shared: Path, apple: LocalApple
) -> tuple[dict[str, subprocess.Popen[bytes]], Callable[[str], None]]:
    """The agents, and how to start one of them again (as launchd would after it died)."""
    processes = {}
    configs = {}
    for region, agent_ids in FLEET.items():
        for agent_id in agent_ids:
            path = work / "agents" / f"{agent_id}.toml"
            settings: dict[str, Any] = {
                **AGENT_SETTINGS,
                "release_endpoints": release_endpoints(apple),
                **({"labels": LABELS[agent_id]} if agent_id in LABELS else {}),
            }
            configs[agent_id] = write_agent_config(
                path, stack_file, region, agent_id, CAPACITY[region], **settings
            )
            processes[agent_id] = demo_stack.enter_context(
                agent_process(configs[agent_id], work / f"{agent_id}.log", env=agent_environment(shared))
            )

    def restart(agent_id: str) -> None:
        if processes[agent_id].poll() is not None:
            processes[agent_id] = demo_stack.enter_context(
                agent_process(configs[agent_id], work / f"{agent_id}.log", env=agent_environment(shared))
            )

    return processes, restart


def stop_all(processes: dict[str, subprocess.Popen[bytes]]) -> None:
    for process in processes.values():
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)


def keep_running(demo: Demo) -> None:
    """The stack, its agents and a console on loopback left running for a look, until Ctrl-C."""
    from relevo_cli.console.server import ConsoleServer
    from relevo_cli.console.state import Console

    port = int(os.environ.get("RELEVO_DEMO_CONSOLE_PORT", "8765"))
    with ConsoleServer(Console(demo.api), port=port) as server:
        console.print(
            f"[bold]relevo console[/bold]: {server.url}", markup=True, highlight=False, soft_wrap=True
        )
        console.print(
            f"stack file {demo.stack_file}: `relevo --help` commands take `--stack-file {demo.stack_file}`; "
            "Ctrl-C stops everything",
            highlight=False,
            soft_wrap=True,
        )
        stop = threading.Event()
        # Ctrl-C in the terminal, or SIGTERM from a supervisor (a background job ignores SIGINT).
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            while not stop.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass


@contextmanager
def recording() -> Iterator[Recorder]:
    forge = Recorder().start()
    try:
        yield forge
    finally:
        forge.stop()


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="relevo-demo-"))
    shared = work / "shared"
    (work / "agents").mkdir(parents=True)
    shared.mkdir()
    state_dir = ROOT / ".relevo" / f"demo-{os.getpid()}"
    stack_file = state_dir / "stack.json"
    restart_clock()
    console.print(f"[bold]Relevo demo[/bold] (logs in {work})")
    passed = False
    try:
        with ExitStack() as running:
            regions = ",".join(FLEET)
            say(
                "setup",
                "starting the local stack: moto + template.yaml + statemachines/job.asl.json, regions "
                f"{regions}…",
            )
            stack = running.enter_context(
                local_stack(state_dir, work / "local-up.log", ["--region-affinities", regions])
            )
            stack.apply_to_environment()
            say(
                "setup",
                f"API {stack.api_url}, {len(stack.resources)} resources, work queues: "
                f"{', '.join(stack.work_queues)}",
            )
            apple = start_local_apple(timing=APPLE_TIMING, review_sec=APPLE_REVIEW_SEC)
            running.callback(apple.stop)
            say("setup", f"local Apple service (App Store Connect, notary) at {apple.service.url}")
            processes, restart = start_fleet(running, work, stack_file, shared, apple)
            # On the way out, every agent is asked to stop at once (each then drains on its own)
            # before the ExitStack waits for them one by one and stops the stack.
            running.callback(stop_all, processes)
            fleet = ", ".join(f"{agent_id} ({region})" for region, ids in FLEET.items() for agent_id in ids)
            say("setup", f"started {len(processes)} relevo-agent processes: {fleet}")
            demo = Demo(stack, stack_file, work, shared, processes, restart, apple, add_apple_apps(apple))
            # acme/release-app itself: a local repository its stages check out at the pushed commit.
            origin, release_commit = release_repository(work)

            # GitHub and Slack, played by a loopback recorder: what Relevo posts is shown from it.
            forge = running.enter_context(recording())
            webhook_secret = secrets.token_urlsafe(24)
            os.environ["RELEVO_DEMO_WEBHOOK_SECRET"] = webhook_secret
            for path in sorted(PROJECTS.glob("*.yaml")):
                project = apply_project_file(stack, demo.api, path)
                gate = project["approval"]["before"] if project["approval"]["enabled"] else None
                stages = " → ".join(
                    ("(approval) → " if s["name"] == gate else "") + s["name"] for s in project["stages"]
                )
                say("setup", f"project [bold]{project['id']}[/bold] ({project['region_affinity']}): {stages}")
            check_out_release_from(demo, origin)
            use_local_apple(demo)
            apps = ", ".join(f"{project} → app {app_id}" for project, app_id in demo.apps.items())
            say("setup", f"team key stored in Secrets Manager (relevo/…/_release/<project>/asc-key); {apps}")
            report_release_to(demo, forge)
            say(
                "setup",
                f"release-app reports commit statuses and group release's Slack messages to {forge.url} "
                "(standing in for GitHub and Slack)",
            )

            outcomes = guarded(FLEET_SCENARIO, lambda: scenario_fleet(demo))
            # Independent projects: the scenarios run side by side.
            scenarios: list[tuple[str, Callable[[], ScenarioResult | list[ScenarioResult]]]] = [
                (
                    "signed webhook; 5 stages, approval gate",
                    lambda: scenario_release(demo, webhook_secret, forge, release_commit),
                ),
                ("non-retryable failure → DLQ → redriven", lambda: scenario_dlq(demo)),
                ("agent SIGKILLed mid-upload, upload reconciled", lambda: scenario_kill(demo)),
                # The cache's two jobs use two ap-south Macs: after the shards, which want all three.
                (
                    "build handed to 3 test shards on 3 Macs",
                    lambda: [
                        *guarded("build handed to 3 test shards on 3 Macs", lambda: scenario_shards(demo)),
                        *guarded(CACHES_SCENARIO, lambda: scenario_dep_cache(demo)),
                    ],
                ),
                # The retry is left to the region's other Mac, which the peer suite's 4 shards would
                # fill (us-east: 2 Macs of 2 slots): past handoff_max_wait_sec the failed attempt's
                # Mac takes it back, as placement says, and the scenario would not show the handoff.
                # So the suite runs once the retry is done (a few seconds).
                (
                    TESTS_SCENARIO,
                    lambda: [
                        *guarded(RETRY_SCENARIO, lambda: scenario_retry(demo)),
                        *guarded(TESTS_SCENARIO, lambda: scenario_peer_tests(demo)),
                    ],
                ),
            ]
            if outcomes[0].ok:
                with ThreadPoolExecutor(max_workers=len(scenarios)) as pool:
                    try:
                        for future in [pool.submit(guarded, name, run) for name, run in scenarios]:
                            outcomes += future.result()
                    except BaseException:  # Ctrl-C: the scenarios stop waiting, then everything stops
                        demo.stopping.set()
                        raise
            else:
                outcomes += [
                    ScenarioResult(name, False, ["not run: the fleet never came online"])
                    for name in [*(name for name, _ in scenarios), CACHES_SCENARIO, RETRY_SCENARIO]
                ]
            console.print()
            passed = summary(demo, outcomes)
            if os.environ.get("RELEVO_DEMO_KEEP"):
                keep_running(demo)
            else:
                say(
                    "setup",
                    "to look around after it, run `RELEVO_DEMO_KEEP=1 make demo`: the stack, the agents and "
                    "`relevo console` stay up until Ctrl-C",
                )
            say("setup", "stopping the agents and the local stack…")
        seconds = elapsed()
        if passed:
            console.print(f"[green]✓ demo passed: every scenario held ({seconds:.0f}s)[/green]")
            return 0
        failed = [outcome.scenario for outcome in outcomes if not outcome.ok]
        console.print(
            f"[red]✗ demo failed ({seconds:.0f}s): {'; '.join(failed)} did not hold (logs in {work})[/red]"
        )
        return 1
    except Exception as exc:  # the demo's job is to say what went wrong
        console.print(f"[red]✗ demo failed: {type(exc).__name__}: {exc}[/red]")
        for log in sorted(work.glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-15:]
            console.print(f"[dim]--- {log.name} (last lines)[/dim]")
            for line in tail:
                console.print(line, style="dim", markup=False, highlight=False)
        return 1
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)  # the logs stay in `work`


if __name__ == "__main__":
    sys.exit(main())
