"""A built-in effect's reconcile, probe to decision (issue 44: p50 <= 1 s against the local
service), for app_store_upload, notarization and github_release_asset.

    .venv/bin/python bench/effects.py               # ~1 min
    .venv/bin/python bench/effects.py --samples 40

What a retry does before anything else when its previous attempt's ending is unknown
(relevo_agent.settle, Settle._effect_probe then reconcile.decide), timed from the kind's context
made to the decision: the release key read from the local stack's Secrets Manager (ReleaseKeys,
as the agent reads it: one GetSecretValue per attempt), the kind's probe against the local Apple
service (relevo_local.apple) or the GitHub releases stand-in (local/relevo_local/github/releases.py),
its answer read as the reconcile table's exit, and the decision. Each sample is an effect of its
own, left by a previous attempt that was cut short at a point the kind's tests name: the effect
done (the decision: succeeded), under way (resume), or never started (run again). Leaving them is
not timed: the bench's own context moves the service's clock instead of waiting.

Target: p50 <= 1 s per kind (shown with its p95). Exits 0 when every target is met, 1 when one
is missed, 2 when the bench itself failed (a decision other than the one expected is a failure:
the figure would time the wrong path).
"""

from __future__ import annotations

import argparse
import io
import plistlib
import statistics
import sys
import tempfile
import threading
import time
import traceback
import zipfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.helpers: the GitHub stand-in

from harness import local_stack, report  # noqa: E402

P50_TARGET_SEC = 1.0
SAMPLES = 20
PROJECT = "bench-release"
OPERATION = "job_0000000000benchbenchbench:{stage}#{index}"
PRECONDITION = "bench-precondition"
# The answers cycled through, per kind (a github_release_asset has no "under way").
ANSWERS = {
    "app_store_upload": ("done", "in_progress", "absent"),
    "notarization": ("done", "in_progress", "absent"),
    "github_release_asset": ("done", "absent"),
}
DECISION_OF = {"done": "succeeded", "in_progress": "resume", "absent": "rerun"}


class Cut(Exception):
    """The previous attempt stopped here (its Mac died)."""


@dataclass
class Leaving:
    """The context of the previous attempt, which leaves the effect (untimed): what it records,
    merged as the stage record keeps it; its waits move the service's clock; cut at its
    `cut_at_record`-th record or its first wait when told."""

    secret: dict[str, Any]
    now: Callable[[], float]
    advance: Callable[[float], None]
    cut_at_record: int | None = None
    cut_at_wait: bool = False
    recorded: dict[str, str] = field(default_factory=dict)
    records: int = 0

    def record(self, values: dict[str, str]) -> None:
        self.recorded.update(values)
        self.records += 1
        if self.cut_at_record is not None and self.records >= self.cut_at_record:
            raise Cut()

    def wait(self, seconds: float) -> bool:
        if self.cut_at_wait:
            raise Cut()
        self.advance(seconds)
        return False

    def context(self, file: Path, operation_id: str, endpoints: Any) -> Any:
        from relevo_agent.effects.kind import EffectContext

        return EffectContext(
            operation_id=operation_id,
            workspace=file.parent,
            file=file,
            build_number=None,
            endpoints=endpoints,
            record=self.record,
            line=lambda _text: None,
            secret=lambda _name: dict(self.secret),
            time_left=lambda: 3600.0,
            wait=self.wait,
            now=self.now,
        )

    def leave(self, kind: Any, file: Path, operation_id: str, endpoints: Any) -> dict[str, str]:
        try:
            kind.perform(self.context(file, operation_id, endpoints))
        except Cut:
            pass
        return dict(self.recorded)


def decide(
    kind: Any,
    file: Path,
    operation_id: str,
    recorded: dict[str, str],
    endpoints: Any,
    now: Callable[[], float],
) -> tuple[str, str, float]:
    """What the retry decides, as Settle._effect_probe and reconcile.decide do: (the decision, the
    probe's evidence, the seconds it took)."""
    from relevo_agent import reconcile
    from relevo_agent.effects.agent_side import ReleaseKeys, effect_context, probe_result
    from relevo_agent.logs import Masker

    began = time.perf_counter()
    keys = ReleaseKeys(PROJECT)
    context = effect_context(
        operation_id=operation_id,
        workspace=file.parent,
        file=file,
        build_number=None,
        endpoints=endpoints,
        record=lambda _values: None,
        line=lambda _text: None,
        keys=keys,
        time_left=lambda: 600.0,
        stop=threading.Event(),
        now=now,
    )
    found = kind.probe(context, recorded)
    probe = probe_result(found, operation_id, keys.masker(Masker([])))
    previous = {
        "attempt": 1,
        "agent_id": "bench-mac",
        "precondition_version": PRECONDITION,
        "outputs": recorded,
    }
    decided = reconcile.decide(operation_id, None, previous, PRECONDITION, probe, resumable=True)
    return decided.action.value, found.evidence, time.perf_counter() - began


# ------------------------------------------------------------------------------------------------
# The kinds, each sample's effect left by a previous attempt


def make_ipa(build: int) -> bytes:
    info = {
        "CFBundleIdentifier": "com.example.bench",
        "CFBundleShortVersionString": "1.4.0",
        "CFBundleVersion": str(build),
    }
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("Payload/App.app/Info.plist", plistlib.dumps(info))
        archive.writestr("Payload/App.app/App", b"\xcf\xfa\xed\xfe" + build.to_bytes(4, "big") * 2048)
    return out.getvalue()


@dataclass
class Apple:
    service: Any
    secret: dict[str, Any]
    secret_name: str
    app_id: str

    def now(self) -> float:
        return float(self.service.clock.now().timestamp())

    def endpoints(self) -> Any:
        from relevo_agent.effects.kind import Endpoints

        return Endpoints(app_store_connect=self.service.url, notary=f"{self.service.url}/notary/v2")

    def left(self, kind: Any, file: Path, operation_id: str, answer: str) -> tuple[Any, Path, str, dict]:
        """The effect a previous attempt left as `answer` says: done, cut at its first wait for
        Apple (in progress), or cut at its first record (absent)."""
        leaving = Leaving(
            self.secret,
            self.now,
            self.service.clock.advance,
            cut_at_record=1 if answer == "absent" else None,
            cut_at_wait=answer == "in_progress",
        )
        return kind, file, operation_id, leaving.leave(kind, file, operation_id, self.endpoints())


def app_store_upload_sample(apple: Apple, work: Path, index: int, answer: str) -> tuple[Any, Path, str, dict]:
    from relevo_agent.effects.app_store_upload import AppStoreUploadEffect
    from relevo_core.models.effect import AppStoreUpload

    file = work / f"upload-{index}" / "App.ipa"
    file.parent.mkdir(parents=True)
    file.write_bytes(make_ipa(100 + index))
    spec = {
        "kind": "app_store_upload",
        "file": "App.ipa",
        "app_id": apple.app_id,
        "api_key": apple.secret_name,
    }
    kind = AppStoreUploadEffect(AppStoreUpload.model_validate(spec))
    # Under way: the upload committed, Apple still processing it; never started: cut at the first
    # record (the identifiers), before any request.
    return apple.left(kind, file, OPERATION.format(stage="upload", index=index), answer)


def notarization_sample(apple: Apple, work: Path, index: int, answer: str) -> tuple[Any, Path, str, dict]:
    from relevo_agent.effects.notarization import NotarizationEffect
    from relevo_core.models.effect import Notarization

    file = work / f"notarize-{index}" / "App.zip"
    file.parent.mkdir(parents=True)
    file.write_bytes(b"PK\x05\x06" + index.to_bytes(4, "big") * 4096)
    spec = Notarization(kind="notarization", file="App.zip", api_key=apple.secret_name)
    kind = NotarizationEffect(spec, upload_endpoint=f"{apple.service.url}/s3")
    # Under way: submitted and uploaded, cut at the first wait for Apple's review; never started:
    # cut at the first record (the name and sha256), before Submit Software.
    return apple.left(kind, file, OPERATION.format(stage="notarize", index=index), answer)


def github_sample(
    github: Any, token: dict[str, Any], secret_name: str, work: Path, index: int, answer: str
) -> tuple[Any, Path, str, dict]:
    from relevo_agent.effects.github_release_asset import GithubReleaseAssetEffect
    from relevo_agent.effects.kind import Endpoints
    from relevo_core.models.effect import GithubReleaseAsset

    tag = f"v1.4.{index}"
    github.add_release("acme/app", tag)
    file = work / f"asset-{index}" / "App.zip"
    file.parent.mkdir(parents=True)
    file.write_bytes(b"PK\x05\x06" + index.to_bytes(4, "big") * 4096)
    spec = GithubReleaseAsset(
        kind="github_release_asset", file="App.zip", repository="acme/app", tag=tag, token=secret_name
    )
    kind = GithubReleaseAssetEffect(spec)
    leaving = Leaving(token, time.time, lambda _sec: None, cut_at_record=1 if answer == "absent" else None)
    operation_id = OPERATION.format(stage="publish", index=index)
    recorded = leaving.leave(kind, file, operation_id, Endpoints(github=github.url))
    return kind, file, operation_id, recorded


# ------------------------------------------------------------------------------------------------
# The run


class StandInChecks:
    """The seconds the GitHub stand-in spends checking each request and answer against GitHub's
    whole REST description (local/relevo_local/github/openapi.py): about 0.3-0.5 s a request on this
    machine, a cost of the test double that GitHub does not have, so it is taken off the
    github_release_asset figure (and shown)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._lock = threading.Lock()

    def install(self) -> Callable[[], None]:
        import relevo_local.github.releases as stand_in

        originals = stand_in.check_call, stand_in.check_answer

        def timed(check: Callable[..., Any]) -> Callable[..., Any]:
            def run(*args: Any, **kwargs: Any) -> Any:
                began = time.perf_counter()
                try:
                    return check(*args, **kwargs)
                finally:
                    with self._lock:
                        self.seconds += time.perf_counter() - began

            return run

        stand_in.check_call, stand_in.check_answer = (timed(check) for check in originals)

        def restore() -> None:
            stand_in.check_call, stand_in.check_answer = originals

        return restore


@contextmanager
def services(stack: Any) -> Iterator[tuple[Apple, Any, dict[str, Any], str]]:
    """The local Apple service with a team key and an app, the GitHub stand-in, and both keys in
    the local stack's Secrets Manager under the project's release prefix."""
    import json

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from relevo_core.aws import client
    from relevo_local.apple.auth import ApiKey
    from relevo_local.apple.service import AppleService
    from relevo_local.github.releases import TOKEN, GithubReleases

    private = ec.generate_private_key(ec.SECP256R1())
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    key = {"key_id": "2X9R4HXF34", "issuer_id": "57246542-96fe-1a63-e053-0824d011072a", "private_key": pem}
    token = {"token": TOKEN}
    prefix = f"relevo/{stack.stack_name}/_release/{PROJECT}"
    secrets = client("secretsmanager")
    secrets.create_secret(Name=f"{prefix}/asc-key", SecretString=json.dumps(key))
    secrets.create_secret(Name=f"{prefix}/github-token", SecretString=json.dumps(token))
    with ExitStack() as running:
        service = running.enter_context(AppleService())
        service.add_key(ApiKey(key["issuer_id"], key["key_id"], private.public_key()))
        app = service.connect.add_app("com.example.bench", "Bench")
        github = GithubReleases(TOKEN).start()
        running.callback(github.stop)
        yield Apple(service, key, f"{prefix}/asc-key", app.id), github, token, f"{prefix}/github-token"
        mismatches = [*service.take_mismatches(), *github.mismatches]
        if mismatches:
            raise RuntimeError(
                f"requests or answers departed from Apple's or GitHub's description: {mismatches}"
            )


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def measure(stack: Any, work: Path, samples: int, kinds: list[str]) -> tuple[list[str], bool]:
    from relevo_agent.effects.kind import Endpoints

    lines, ok = [], True
    checks = StandInChecks()
    with ExitStack() as running:
        running.callback(checks.install())
        apple, github, token, github_secret = running.enter_context(services(stack))
        makers = {
            "app_store_upload": lambda i, a: app_store_upload_sample(apple, work, i, a),
            "notarization": lambda i, a: notarization_sample(apple, work, i, a),
            "github_release_asset": lambda i, a: github_sample(github, token, github_secret, work, i, a),
        }
        # Where each kind asks, and its clock (a JWT's iat: the Apple service's own).
        asks = {
            "app_store_upload": (apple.endpoints(), apple.now),
            "notarization": (apple.endpoints(), apple.now),
            "github_release_asset": (Endpoints(github=github.url), time.time),
        }
        for name in kinds:
            seconds: dict[str, list[float]] = {answer: [] for answer in ANSWERS[name]}
            stand_in: list[float] = []
            for index in range(samples):
                answer = ANSWERS[name][index % len(ANSWERS[name])]
                kind, file, operation_id, recorded = makers[name](index, answer)
                checked = checks.seconds
                decision, evidence, took = decide(kind, file, operation_id, recorded, *asks[name])
                stand_in.append(checks.seconds - checked)
                took -= stand_in[-1]
                if decision != DECISION_OF[answer]:
                    raise RuntimeError(
                        f"{name} sample {index}: left {answer}, decided {decision} ({evidence})"
                    )
                seconds[answer].append(took)
            every = [s for taken in seconds.values() for s in taken]
            p50, p95 = statistics.median(every), percentile(every, 0.95)
            met = p50 <= P50_TARGET_SEC
            ok = ok and met
            figure = f"{name} reconcile, probe -> decision"
            report("effects", f"{figure}, p50", p50, ms(p50), f"<= {P50_TARGET_SEC:.0f} s", met)
            report("effects", f"{figure}, p95", p95, ms(p95), "shown (p50 is the target)", True)
            by_answer = ", ".join(
                f"{answer} -> {DECISION_OF[answer]} p50 {ms(statistics.median(taken))} ({len(taken)})"
                for answer, taken in seconds.items()
            )
            lines.append(
                f"{name:<21} p50 {ms(p50):>6}  p95 {ms(p95):>6}  max {ms(max(every)):>6}"
                f"  target p50 <= {P50_TARGET_SEC:.0f} s{'' if met else '   << missed'}\n    {by_answer}"
            )
            if any(stand_in):
                lines.append(
                    f"    taken off: the stand-in's own checks against GitHub's description, p50 "
                    f"{ms(statistics.median(stand_in))} a decision"
                )
    return lines, ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=SAMPLES, help="effects probed per kind")
    parser.add_argument("--only", choices=sorted(ANSWERS), action="append")
    args = parser.parse_args()
    began = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="relevo-bench-effects-") as scratch:
            work = Path(scratch)
            with local_stack(work / "stack") as info:
                lines, ok = measure(info, work / "files", args.samples, args.only or list(ANSWERS))
    except Exception as exc:
        traceback.print_exc()
        print(f"bench error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print(f"a retry's reconcile of a built-in effect, probe -> decision, {args.samples} effects per kind:")
    print("\n".join(lines))
    print(f"total {time.perf_counter() - began:.1f}s; {0 if ok else 1} target(s) missed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
