"""What each console page shows, built from the API's answers: one module per page, each a plain
function of a Console (relevo_cli.console.state) that the page's route calls off the event loop."""
