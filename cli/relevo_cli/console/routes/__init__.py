"""The console's routes, one module per page, each with its ROUTES: a handler reads the request,
calls one view builder or API call off the event loop, and answers with relevo_cli.console.render."""
