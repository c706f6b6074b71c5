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

With `run_as` (relevo_agent.build_user) the command is another user's, and whatever of the
agent's environment points at the agent user's own things goes too (`as_build_user`): every
path into the agent's home (XDG_*_HOME, a tool's *_HOME, ~/bin on PATH: the build could not read
them, or would read the agent's settings), the agent's login session (its ssh and gpg agents,
session bus, Kerberos tickets: each acts with the agent user's keys) and a TMPDIR that is the
agent's private one (macOS gives each user its own under /var/folders; the build could not write
there, and tools then fall back to the build user's own). HOME, USER and LOGNAME are the build
user's.
"""

from __future__ import annotations

import os
import pwd
import stat
from collections.abc import Mapping
from pathlib import Path

from relevo_agent.build_user import BuildUser

# Not credentials and not pointers to any: where AWS calls go by default.
KEPT_AWS_VARIABLES = frozenset({"AWS_REGION", "AWS_DEFAULT_REGION"})
# Relevo's own variables of the agent process that point at its credentials.
AGENT_VARIABLES = frozenset({"RELEVO_STACK_FILE", "RELEVO_USER_STACK_FILE"})
# The agent user's login session: agents, buses and tickets that act with that user's keys.
AGENT_SESSION_VARIABLES = frozenset(
    {
        "SSH_AUTH_SOCK",
        "SSH_AGENT_PID",
        "GPG_AGENT_INFO",
        "DBUS_SESSION_BUS_ADDRESS",
        "XDG_RUNTIME_DIR",
        "XAUTHORITY",
        "KRB5CCNAME",
        "MAIL",
    }
)


def without_agent_credentials(parent: Mapping[str, str]) -> dict[str, str]:
    return {
        name: value
        for name, value in parent.items()
        if not (name.upper().startswith("AWS_") and name.upper() not in KEPT_AWS_VARIABLES)
        and name.upper() not in AGENT_VARIABLES
    }


def stage_environment(
    parent: Mapping[str, str], relevo: Mapping[str, str], aws_profile: str | None
) -> dict[str, str]:
    """The agent's environment without its credentials, Relevo's variables for the stage, and the
    project's AWS profile for the stage, if it names one."""
    env = {**without_agent_credentials(parent), **relevo}
    if aws_profile:
        env["AWS_PROFILE"] = aws_profile
    return env


def as_build_user(
    env: Mapping[str, str], user: BuildUser, agent_homes: tuple[str, ...] | None = None
) -> dict[str, str]:
    """`env` of a stage for a command run as `user` (module docstring). `agent_homes`: the agent
    user's home directories (default: its HOME and its password entry's)."""
    given = [home for home in (agent_homes if agent_homes is not None else _agent_homes()) if home]
    homes = {Path(path) for home in given for path in (os.path.normpath(home), os.path.realpath(home))} - {
        Path("/")
    }

    def inside(entry: str) -> bool:
        return os.path.isabs(entry) and any(
            Path(os.path.normpath(entry)).is_relative_to(home) for home in homes
        )

    kept: dict[str, str] = {}
    for name, value in env.items():
        if name in AGENT_SESSION_VARIABLES or (name == "TMPDIR" and not _shared_temporary(value)):
            continue
        # A path, or a list of them (PATH, MANPATH): what lies in the agent's home goes.
        entries = value.split(os.pathsep)
        left = [entry for entry in entries if not inside(entry)]
        if len(left) == len(entries):
            kept[name] = value
        elif left:
            kept[name] = os.pathsep.join(left)
    return {**kept, "HOME": str(user.home), "USER": user.name, "LOGNAME": user.name}


def _agent_homes() -> tuple[str, ...]:
    return (os.environ.get("HOME", ""), pwd.getpwuid(os.geteuid()).pw_dir)


def _shared_temporary(path: str) -> bool:
    """A directory every user may write in, each only removing their own (/tmp)."""
    try:
        info = os.stat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_mode & 0o1777 == 0o1777
