#!/usr/bin/env bash
# Set up if needed, then lint and run the test suite (the simulator without a GPU; the GPU with one).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k atomics` or `--backend cuda`.
source "$(dirname "$0")/env.sh" || exit 1
cd "$ROOT" || exit 1
if "$PY" -m ruff --version >/dev/null 2>&1; then
    "$PY" -m ruff check . || exit 1
fi
exec "$PY" -m pytest -q "$@"
