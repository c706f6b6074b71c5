"""Which error class a finished stage command falls into, by the frozen retry policy."""

from __future__ import annotations

from relevo_agent.classify import classify
from relevo_core.models.errors import EX_TEMPFAIL, ErrorClass
from relevo_core.models.plan import OutputRule, RetryPolicy

DEFAULT = RetryPolicy()


def rules(*pairs: tuple[str, ErrorClass]) -> RetryPolicy:
    """A policy with these (pattern, class) output rules, in order."""
    return RetryPolicy(output_rules=tuple(OutputRule(pattern=p, error_class=c) for p, c in pairs))


def test_exit_75_is_transient_by_default() -> None:
    """Given the default policy, when a command exits 75 (EX_TEMPFAIL), then it is a transient exit."""
    assert EX_TEMPFAIL == 75
    result = classify(75, "", DEFAULT, timed_out=False)
    assert result is ErrorClass.TRANSIENT_EXIT
    assert result.value == "Relevo.Transient.ExitCode"
    assert result.retryable


def test_exit_1_is_fatal_by_default() -> None:
    """Given the default policy, when a command exits 1, then it is a fatal exit code."""
    result = classify(1, "boom", DEFAULT, timed_out=False)
    assert result is ErrorClass.COMMAND_FAILED
    assert result.value == "Relevo.Fatal.ExitCode"
    assert not result.retryable


def test_timeout_is_an_exec_timeout() -> None:
    """Given a command that timed out, when classified, then it is Relevo.Timeout.Exec."""
    assert classify(-15, "", DEFAULT, timed_out=True).value == "Relevo.Timeout.Exec"


def test_timeout_wins_over_output_rules_and_exit_codes() -> None:
    """Given a timed-out command whose output matches a rule and whose code is transient, when
    classified, then the timeout wins."""
    policy = rules(("ECONNRESET", ErrorClass.CONNECTION_RESET))
    assert classify(75, "read ECONNRESET", policy, timed_out=True) is ErrorClass.EXEC_TIMEOUT


def test_output_rule_wins_over_exit_codes() -> None:
    """Given an output rule that matches, when the command exits with a transient or a fatal code,
    then the rule's class is used."""
    policy = rules((r"(?i)certificate .* expired", ErrorClass.CERTIFICATE_EXPIRED))
    output = "codesign: Certificate 'Dev ID' has expired\n"
    assert classify(75, output, policy, timed_out=False) is ErrorClass.CERTIFICATE_EXPIRED
    assert classify(1, output, policy, timed_out=False) is ErrorClass.CERTIFICATE_EXPIRED


def test_first_matching_output_rule_wins() -> None:
    """Given two rules that both match, when classified, then the first declared wins."""
    policy = rules(("HTTP 503", ErrorClass.STORAGE_5XX), ("HTTP", ErrorClass.CLIENT_4XX))
    assert classify(1, "upload failed: HTTP 503", policy, timed_out=False) is ErrorClass.STORAGE_5XX
    assert classify(1, "upload failed: HTTP 404", policy, timed_out=False) is ErrorClass.CLIENT_4XX


def test_output_rule_searches_anywhere_in_multiline_output() -> None:
    """Given a rule and multi-line output where the match is on a later line, when classified,
    then the rule still matches (re.search, not match)."""
    policy = rules(("reset by peer", ErrorClass.CONNECTION_RESET))
    output = "step 1 ok\nstep 2 ok\ncurl: (56) Connection reset by peer\n"
    assert classify(56, output, policy, timed_out=False) is ErrorClass.CONNECTION_RESET


def test_non_matching_rule_falls_back_to_exit_codes() -> None:
    """Given a rule that does not match, when classified, then the exit code decides."""
    policy = rules(("ECONNRESET", ErrorClass.CONNECTION_RESET))
    assert classify(75, "all fine", policy, timed_out=False) is ErrorClass.TRANSIENT_EXIT
    assert classify(2, "all fine", policy, timed_out=False) is ErrorClass.COMMAND_FAILED


def test_project_declared_transient_exit_codes_replace_the_default() -> None:
    """Given a project that declares its own transient exit codes, when classified, then those codes
    are transient and 75 is no longer (the list replaces the default, it does not extend it)."""
    policy = RetryPolicy(transient_exit_codes=(42, 143))
    assert classify(42, "", policy, timed_out=False) is ErrorClass.TRANSIENT_EXIT
    assert classify(143, "", policy, timed_out=False) is ErrorClass.TRANSIENT_EXIT
    assert classify(75, "", policy, timed_out=False) is ErrorClass.COMMAND_FAILED
    assert classify(1, "", policy, timed_out=False) is ErrorClass.COMMAND_FAILED


def test_empty_transient_list_makes_every_exit_fatal() -> None:
    """Given a project that declares no transient exit codes, when a command exits 75, then it is fatal."""
    policy = RetryPolicy(transient_exit_codes=())
    assert classify(75, "", policy, timed_out=False) is ErrorClass.COMMAND_FAILED
