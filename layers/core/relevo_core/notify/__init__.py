"""Telling people and forges what a job did: commit statuses (GitHub, GitLab) and group channels,
driven by the table's change stream (functions/status_reporter)."""
