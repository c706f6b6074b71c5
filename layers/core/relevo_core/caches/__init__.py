"""Caches: what a project's jobs keep across jobs, kept within the project's limits."""
