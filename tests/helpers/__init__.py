"""What tests share: helpers live here, never in conftest.py (which holds fixtures only) nor in
another test module.

- `stack`: calls to the session's local stack the way clients and agents make them;
- `state_machine`: an agent's part in a job, played by the test (claim, accept, report);
- `payloads`: webhook bodies;
- `stack_files`: stack files for the agent's and the CLI's config tests;
- `iam`: calls as a given role session, and the refusal AWS gives.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The test stack's AdminPrincipals: an IAM user (created by the tests that need it) with manage
# on every project. The default test principal (the local key) is not one: it manages the
# projects it creates, like any other creator.
TEST_ADMIN_ARN = "arn:aws:iam::123456789012:user/relevo-test-admin"
