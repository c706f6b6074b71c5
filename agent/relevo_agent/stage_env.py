"""The environment a stage's command runs with: the agent's own, less everything that would let
the build act as the agent.

A build runs code Relevo does not control (a dependency's install script, a pull request built
with `fork_pull_requests: run`). With the agent's credentials it could write to the job table
and rewrite what every Mac of the fleet runs next. So the command gets no `AWS_*` variable (keys,
session tokens, profiles, credential and config file paths, container and web-identity
credential sources, the endpoint) and no pointer to the agent's stack file (a local stack's
holds a key). What a stage needs from AWS it names in the project file: `aws_profile`, a
profile of the build user's own AWS configuration on the Mac. Region variables stay: they say
where, not who.
"""

from __future__ import annotations

from collections.abc import Mapping

# Not credentials and not pointers to any: where AWS calls go by default.
KEPT_AWS_VARIABLES = frozenset({"AWS_REGION", "AWS_DEFAULT_REGION"})
# Relevo's own variables of the agent process that point at its credentials.
AGENT_VARIABLES = frozenset({"RELEVO_STACK_FILE", "RELEVO_USER_STACK_FILE"})


def without_agent_credentials(parent: Mapping[str, str]) -> dict[str, str]:
    return {
        name: value
        for name, value in parent.items()
        if not (name.upper().startswith("AWS_") and name.upper() not in KEPT_AWS_VARIABLES) and name.upper() not in AGENT_VARIABLES
    }


def stage_environment(parent: Mapping[str, str], relevo: Mapping[str, str], aws_profile: str | None) -> dict[str, str]:
    """The agent's environment without its credentials, Relevo's variables for the stage, and the
    project's AWS profile for the stage, if it names one."""
    env = {**without_agent_credentials(parent), **relevo}
    if aws_profile:
        env["AWS_PROFILE"] = aws_profile
    return env
