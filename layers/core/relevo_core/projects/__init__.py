"""Projects: the registry (apply, read, list), who may do what on a project, and the hand-off of a
project's lock to the next waiting job."""
