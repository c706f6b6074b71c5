"""Stand-ins for GitHub on loopback (tests, benches), checked against its published REST
description (openapi.py): its releases and their assets (releases.py)."""
