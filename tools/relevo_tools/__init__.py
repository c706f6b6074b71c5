"""Relevo's development tools: what builds, checks and demonstrates Relevo, and that the operator CLI never
imports."""
