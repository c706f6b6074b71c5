# `make demo`'s dep-cache stages: the project's dependency step, as a CI script writes it. pip
# installs requirements.lock into the workspace's .venv, unless .venv already holds this lock file
# (restored from the cache): then it does nothing. The wheels come from $RELEVO_DEMO_WHEELS, the
# demo's local copy of them (pip's own cache off: a fresh Mac has none). It writes to
# $RELEVO_OUTPUT how long the step took and the .venv tree's digest, computed from this Mac's disk.
set -e
clock() { "$RELEVO_DEMO_PYTHON" -c 'import time; print(time.time())'; }
began=$(clock)
if cmp -s requirements.lock .venv/requirements.lock; then
  echo "dependencies restored: .venv holds this requirements.lock, nothing to install"
else
  "$RELEVO_DEMO_PYTHON" -m venv --without-pip .venv
  "$RELEVO_DEMO_PYTHON" -m pip --python .venv/bin/python install --quiet --no-cache-dir \
    --no-index --find-links "$RELEVO_DEMO_WHEELS" -r requirements.lock
  cp requirements.lock .venv/requirements.lock
  echo "pip installed $(grep -c -- '--hash=' requirements.lock) pinned wheels into .venv"
fi
ended=$(clock)
seconds=$("$RELEVO_DEMO_PYTHON" -c "print(f'{$ended - $began:.2f}')")
digest=$("$RELEVO_DEMO_PYTHON" "$RELEVO_DEMO_TOOLS/tree_digest.py" .venv)
echo "dependency step: ${seconds}s; .venv $digest"
echo "step_seconds=$seconds" >> "$RELEVO_OUTPUT"
echo "digest=${digest%% *}" >> "$RELEVO_OUTPUT"
