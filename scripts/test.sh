#!/usr/bin/env bash
# Set up if needed, then lint and run the test suite (the simulator without a GPU; the GPU with one).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k atomics` or `--backend cuda`.
# `bash scripts/test.sh --gpu` runs the whole suite on the cuda backend, ranks concurrent under MPS:
# five pytest-xdist workers, then the tests that must run alone (see tests/conftest.py).
source "$(dirname "$0")/env.sh" || exit 1
cd "$ROOT" || exit 1
if "$PY" -m ruff --version >/dev/null 2>&1; then
    "$PY" -m ruff check . || exit 1
fi
if "$PY" -m mypy --version >/dev/null 2>&1; then  # [tool.mypy] in pyproject.toml: zero errors over trident/
    "$PY" -m mypy || exit 1
fi
if [ "${1:-}" = "--gpu" ]; then
    shift
    status=0
    "$PY" -m pytest -q --backend cuda --mps -n 5 --dist loadfile --no-loadscope-reorder \
        -m "not (kills_ranks or device_wide)" "$@" || status=1
    "$PY" -m pytest -q --backend cuda --mps -m "kills_ranks or device_wide" "$@" || status=1
    exit $status
fi
exec "$PY" -m pytest -q "$@"
