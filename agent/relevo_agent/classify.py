"""Which error class a finished command belongs to, by the frozen plan's rules."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from relevo_core.models.errors import ErrorClass

if TYPE_CHECKING:
    from relevo_core.models.plan import RetryPolicy


def classify(exit_code: int, output: str, policy: RetryPolicy, timed_out: bool) -> ErrorClass:
    if timed_out:
        return ErrorClass.EXEC_TIMEOUT
    for rule in policy.output_rules:
        if re.search(rule.pattern, output):
            return rule.error_class
    if exit_code in policy.transient_exit_codes:
        return ErrorClass.TRANSIENT_EXIT
    return ErrorClass.COMMAND_FAILED
