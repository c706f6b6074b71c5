"""The shared contract: every boundary in Relevo speaks these models.

Import each from its own module (relevo_core.models.envelope, .project, .errors, ...). Nothing is
imported here: a function that needs an error code does not build every model at its cold start.
"""
