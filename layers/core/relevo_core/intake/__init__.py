"""How jobs come in: enqueue (one job per trigger, exactly once), manual and API triggers,
schedules, and Git webhooks."""
