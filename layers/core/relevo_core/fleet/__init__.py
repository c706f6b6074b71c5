"""The fleet of agents: pausing, draining and resuming agents, and pausing a region's dispatch."""
