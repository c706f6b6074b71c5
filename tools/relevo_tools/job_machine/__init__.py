"""statemachines/job.asl.json, generated: `python -m relevo_tools.job_machine` writes it,
`--check` says whether the committed file is what the builder makes."""

from relevo_tools.job_machine.machine import build, render

__all__ = ["build", "render"]
