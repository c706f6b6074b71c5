"""`relevo console`: the web console, served on loopback from the operator's machine (issue 18)."""
