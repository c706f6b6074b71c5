"""The fleet of agents: pausing, draining and resuming agents, and pausing a region's dispatch; an
agent's claim of a stage, the job credentials it comes with, and the timeline of the lease it holds."""
