"""The `relevo` command groups, each with its own rendering; relevo_cli.main assembles them."""
