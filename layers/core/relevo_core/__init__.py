"""Relevo shared core: the job contract and the data access every component shares."""

__version__ = "0.1.0"
