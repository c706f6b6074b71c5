"""The release drills (issue 44): a project whose build stage makes an .ipa (its CFBundleVersion the
job's RELEVO_BUILD_NUMBER) and a .zip, hands them on, and whose `upload` and `notarize` stages are
the built-in effects app_store_upload and notarization, sent to the local Apple service through a
fault proxy per agent. Three faults:

- release-upload-kill: the agent holding the upload SIGKILLed once the commit of the upload's file
  has taken effect at Apple and before its answer is sent (the service's commit hook);
- release-notary-kill: the agent holding the notarization SIGKILLed once the file is in and its
  upload recorded, the submission held In Progress at Apple (faults.hold_in_progress): the next
  attempt must resume it, never submit again;
- release-commit-cut: the agent's path to Apple cut when the commit request arrives (the request
  lands on odd trials, is dropped on even ones), every request after it reset for CUT_SEC.

Each trial is judged at the local Apple service, not by the agent's word: one build upload of the
job's version and build number, one submission bearing the job's notarize operation, each stage
succeeded or held for manual review, an in-progress submission resumed, and one build number per
job, none given to two jobs of the drill."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from typing import Any

from relevo_core.aws import client
from relevo_local.apple.connect_state import ConnectState
from relevo_local.apple.notary import NotaryState
from relevo_local.apple.provision import LocalApple
from relevo_tools.drill.fleet import TERMINAL_JOB, DrillAgent, DrillError, DrillFleet, wait_until
from relevo_tools.drill.proxy import Cut
from relevo_tools.drill.trial import DrillRun, LateFault, Trial

VERSION = "1.0"  # CFBundleShortVersionString: fixed, so the build number alone tells builds apart
UPLOAD, NOTARIZE = 1, 2  # the stages' indexes (build is 0)
COMMIT = "buildUploadFilesUpdateInstance"  # PATCH /v1/buildUploadFiles/{id}: uploaded, with the checksum
COMMIT_REQUEST = b"PATCH /v1/buildUploadFiles/"
HOLD_MINUTES = 0.5  # how long a release-notary-kill submission stays In Progress after it is made
CUT_SEC = 2.0
# A retry waits this long (and longer after each failure): the cut is over before it probes.
BACKOFF_SEC = 3
HELD = ("succeeded", "manual_review")

# The build stage, run with the drill's Python: an .ipa (Payload/App.app/Info.plist, a binary of
# random bytes so no two jobs send the same file) and a .zip to notarize.
_BUILD_PY = (
    "import os,plistlib,zipfile\n"
    "os.makedirs('dist',exist_ok=True)\n"
    "info=plistlib.dumps({'CFBundleIdentifier':'com.acme.release-app','CFBundleName':'App',"
    f"'CFBundleShortVersionString':'{VERSION}','CFBundleVersion':os.environ['RELEVO_BUILD_NUMBER']}})\n"
    "with zipfile.ZipFile('dist/App.ipa','w') as z:\n"
    " z.writestr('Payload/App.app/Info.plist',info)\n"
    " z.writestr('Payload/App.app/App',os.urandom(200000))\n"
    "with zipfile.ZipFile('dist/App.zip','w') as z:\n"
    " z.writestr('App.app/Contents/Info.plist',info)\n"
    " z.writestr('App.app/Contents/MacOS/App',os.urandom(200000))\n"
)
BUILD = f'"$RELEVO_DRILL_PYTHON" -c {shlex.quote(_BUILD_PY)}'


# ---------------------------------------------------------------------- what Apple holds


def upload_count(connect: ConnectState, app_id: str, version: str, build: str) -> int:
    """Build uploads App Store Connect holds for this version and build number, whatever their state."""
    return sum(
        1
        for upload in connect.uploads_of(app_id)
        if (upload.short_version, upload.version) == (version, build)
    )


def submission_count(notary: NotaryState, job_id: str, stage: str = "notarize") -> int:
    """Submissions whose name carries the job's operation (relevo_agent.effects.notarization's
    submission_name: `<stem>.<sha256[:16]>.<job id>.<stage><ext>`)."""
    mark = f".{job_id}.{stage}."
    with notary.lock:
        return sum(1 for submission in notary.submissions.values() if mark in submission.name)


def release_problems(
    apple: LocalApple, job: dict[str, Any], numbers_before: dict[int, str]
) -> tuple[dict[str, int], list[str]]:
    """What Apple holds of this job's two effects, and every way the trial did not hold.
    `numbers_before`: build number -> the job of the drill that was given it before this one."""
    job_id = str(job["job_id"])
    problems: list[str] = []
    number = job.get("build_number")
    if number is None:
        problems.append(f"no build number: {job_id} was given none")
    elif numbers_before.get(int(number), job_id) != job_id:
        problems.append(f"build number given twice: {number} to {numbers_before[int(number)]} and {job_id}")
    uploads = upload_count(apple.service.connect, apple.app_id, VERSION, str(number))
    submissions = submission_count(apple.service.notary, job_id)
    stages = {stage["name"]: stage for stage in job["stages"]}
    for name, count, what, one in (
        ("upload", uploads, f"build uploads of {VERSION} ({number})", "build upload"),
        ("notarize", submissions, "notarizations submitted", "submission"),
    ):
        status = stages.get(name, {}).get("status")
        if count > 1:
            problems.append(f"duplicate effect: {job_id}:{name}: {count} {what} at the local Apple service")
        if status == "succeeded" and count == 0:
            problems.append(
                f"lost effect: {job_id}:{name} succeeded with no {one} at the local Apple service"
            )
        if status not in HELD:
            problems.append(
                f"not held: {job_id}:{name} {status} ({stages.get(name, {}).get('error') or '-'}), "
                "expected succeeded or manual review"
            )
    held_for_review = any(s.get("status") == "manual_review" for s in job["stages"])
    if job["status"] != "succeeded" and not held_for_review:
        problems.append(f"wrongly failed job: {job_id} {job['status']} ({job.get('error') or '-'})")
    mismatches = apple.service.take_mismatches()
    problems += [f"Apple's description: {mismatch}" for mismatch in mismatches]
    return {f"{job_id}:upload": uploads, f"{job_id}:notarize": submissions}, problems


# ---------------------------------------------------------------------- the project and the trial


def _project(fleet: DrillFleet, apple: LocalApple) -> str:
    def body(project_id: str) -> dict[str, Any]:
        key = f"relevo/{fleet.stack.stack_name}/_release/{project_id}/app-store-connect"
        apple.store_key(client("secretsmanager"), key)
        grace = fleet.timing.kill_grace_sec
        return {
            "retry": {"backoff_base_sec": BACKOFF_SEC},
            "build_number": {"stages": ["build"]},
            "stages": [
                {"name": "build", "run": BUILD, "handoff": ["dist"], "exec_timeout_sec": 60},
                {
                    "name": "upload",
                    "effect": {
                        "kind": "app_store_upload",
                        "file": "dist/App.ipa",
                        "app_id": apple.app_id,
                        "api_key": key,
                        # Committed is the effect: Apple's processing after it is not what is drilled.
                        "wait_for_processing": False,
                    },
                    "exec_timeout_sec": 120,
                    "kill_grace_sec": grace,
                },
                {
                    "name": "notarize",
                    "effect": {"kind": "notarization", "file": "dist/App.zip", "api_key": key},
                    "exec_timeout_sec": 180,
                    "kill_grace_sec": grace,
                },
            ],
        }

    return fleet.project_of("release", body)


# Build number -> the job given it, over every release trial of the fleet (kept on the fleet's
# project: one project, one counter).
_NUMBERS: dict[str, dict[int, str]] = {}


class ReleaseRun:
    def __init__(self, fleet: DrillFleet, name: str, number: int) -> None:
        self.fleet = fleet
        self.run = DrillRun(fleet, name, number)
        self.apple = fleet.ensure_apple()
        self.project = _project(fleet, self.apple)
        self.numbers = _NUMBERS.setdefault(self.project, {})
        # Nothing armed by an earlier trial that did not get that far is left for this one.
        self.apple.service.faults.clear_hooks()
        with self.apple.service.notary.lock:
            self.apple.service.notary.next_holds_sec.clear()
        self.apple.service.take_mismatches()
        self.job_id = ""

    @property
    def trial(self) -> Trial:
        return self.run.trial

    def start(self) -> str:
        self.job_id = self.fleet.run(self.project)
        self.trial.jobs.append(self.job_id)
        return self.job_id

    def kill(self, agent: DrillAgent) -> None:
        if agent.alive():
            agent.process.kill()  # type: ignore[union-attr]  # alive(): it has one
            agent.process.wait()  # type: ignore[union-attr]  # alive(): it has one

    def holder(self, index: int) -> DrillAgent | None:
        return self.fleet.agents.get(str(self.fleet.stage_record(self.job_id, index).get("agent_id")))

    def wait_recorded(self, index: int, key: str, timeout: float = 90) -> dict[str, Any]:
        """The stage record once its first attempt recorded `key` among its values."""
        seen: dict[str, Any] = {}

        def recorded() -> bool:
            seen.update(self.fleet.stage_record(self.job_id, index))
            return seen.get("attempt") == 1 and key in (seen.get("outputs") or {})

        wait_until(recorded, timeout, f"{self.job_id} stage {index} recording {key}", poll=0.05)
        return seen

    def finish(self, what: str) -> dict[str, Any]:
        """The job once it ended or a stage of it waits for review, judged at Apple."""
        job = self.fleet.wait_job(
            self.job_id,
            lambda j: j["status"] in TERMINAL_JOB or any(s["status"] == "manual_review" for s in j["stages"]),
        )
        effects, problems = release_problems(self.apple, job, self.numbers)
        self.trial.effects.update(effects)
        self.trial.problems += problems
        if job.get("build_number") is not None:
            self.numbers.setdefault(int(job["build_number"]), self.job_id)
        attempts = {s["name"]: s.get("attempt") or 0 for s in job["stages"]}
        self.trial.attempts = attempts.get("upload", 0) + attempts.get("notarize", 0)
        # Effects found under way and waited for by the next attempt, never sent again.
        self.trial.resumed = sum(_decision(s) == "resume" for s in job["stages"])
        reviewed = [s["name"] for s in job["stages"] if s["status"] == "manual_review"]
        self.trial.outcome = (
            f"{what}; build {job.get('build_number')}; {job['status']}"
            + (f", {', '.join(reviewed)} held for review" if reviewed else "")
            + "".join(
                f"; {s['name']} attempt {s.get('attempt')}: {_decision(s)}"
                for s in job["stages"]
                if _decision(s)
            )
        )
        return job


def _decision(stage: dict[str, Any]) -> str | None:
    reconciled = stage.get("reconciled")
    if isinstance(reconciled, list):
        reconciled = reconciled[-1] if reconciled else None
    return (reconciled or {}).get("decision")


def upload_kill(fleet: DrillFleet, number: int) -> Trial:
    """SIGKILL of the upload's holder after the commit took effect, before Apple's answer."""
    release = ReleaseRun(fleet, "release-upload-kill", number)
    killed: list[str] = []

    def kill_the_holder() -> None:
        agent = release.holder(UPLOAD)
        if agent is not None:
            release.kill(agent)
            killed.append(agent.agent_id)

    release.apple.service.faults.on_commit(COMMIT, kill_the_holder)
    release.start()
    release.finish("")  # judged below, once the kill is known to have happened
    if not killed:
        raise LateFault("the upload's commit never reached the local Apple service's hook")
    release.trial.outcome = f"{killed[0]} killed after the commit{release.trial.outcome}"
    return release.trial


def notary_kill(fleet: DrillFleet, number: int) -> Trial:
    """SIGKILL of the notarization's holder once its file is in and recorded, the submission held
    In Progress: the next attempt must resume it."""
    release = ReleaseRun(fleet, "release-notary-kill", number)
    release.apple.service.faults.hold_in_progress(HOLD_MINUTES)
    release.start()
    record = release.wait_recorded(NOTARIZE, "uploaded")
    submission_id = str(record["outputs"].get("submission_id"))
    agent = fleet.agents.get(str(record.get("agent_id")))
    if agent is None:
        raise DrillError(f"{release.job_id}:notarize is held by no agent of the drill")
    if release.apple.service.notary.status(release.apple.service.notary.get(submission_id)) != "In Progress":
        raise LateFault(f"submission {submission_id} was no longer in progress when its holder was killed")
    release.kill(agent)
    job = release.finish(f"{agent.agent_id} killed, submission {submission_id} In Progress")
    notarize = next(s for s in job["stages"] if s["name"] == "notarize")
    if _decision(notarize) != "resume":
        release.trial.problems.append(
            f"not resumed: {release.job_id}:notarize's in-progress submission was decided "
            f"{_decision(notarize) or 'without a reconciliation'}"
        )
    return release.trial


def commit_cut(fleet: DrillFleet, number: int) -> Trial:
    """The holder's path to Apple cut at the commit request: landed on odd trials, dropped on even."""
    release = ReleaseRun(fleet, "release-commit-cut", number)
    lands = number % 2 == 1
    proxies = [agent.apple_proxy for agent in fleet.agents.values() if agent.apple_proxy is not None]
    cuts_before = sum(proxy.stats.cuts for proxy in proxies)
    # Armed on every agent's path (which one holds the upload is known only once it claims), it
    # fires once: on the path of the first commit request, never on the retry's.
    cut = Cut(COMMIT_REQUEST, lands, CUT_SEC)
    for proxy in proxies:
        proxy.arm_cut(cut)
    try:
        release.start()
        release.finish("")
    finally:
        fired = sum(proxy.stats.cuts for proxy in proxies) - cuts_before
        for proxy in proxies:
            proxy.heal()  # disarms the cut on the agent that did not hold the upload
    if not fired:
        raise LateFault("no commit request crossed a proxy: the cut never happened")
    landed = "landed, its answer lost" if lands else "dropped"
    release.trial.outcome = f"cut at the commit ({landed}){release.trial.outcome}"
    return release.trial


RELEASE_DRILLS: dict[str, Callable[[DrillFleet, int], Trial]] = {
    "release-upload-kill": upload_kill,
    "release-notary-kill": notary_kill,
    "release-commit-cut": commit_cut,
}
