"""The loopback recorder that stands in for GitHub, GitLab or Slack (the demo uses it too)."""

from relevo_local.recorder import Answer, Recorded, Recorder

__all__ = ["Answer", "Recorded", "Recorder"]
