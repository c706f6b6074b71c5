"""Shapes shared by the models and the store's keys: identifier patterns and the priority range.

A module of its own, so that whatever names a project or orders jobs by priority (a project, a
group, a setting, a key) does not build the job envelope to do it.
"""

REGION_AFFINITY = r"^[a-z][a-z0-9-]{0,31}$"
PROJECT_ID = r"^[a-z0-9][a-z0-9-]{0,62}$"
JOB_ID = r"^job_[0-9a-z]{20,40}$"

# Priorities span -PRIORITY_BOUND..PRIORITY_BOUND; higher runs first.
PRIORITY_BOUND = 1_000_000
