"""What brings jobs back after something went wrong: the dead-letter queue, the freeze of a key
that keeps dead-lettering, and the sweeper for executions and locks left behind."""
