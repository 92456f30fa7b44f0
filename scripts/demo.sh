#!/usr/bin/env bash
# Set up if needed, then run the main demo on 4 ranks: on the GPUs if there are any, else in the CPU simulator.
source "$(dirname "$0")/env.sh" || exit 1
cd "$ROOT" && "$PY" -m trident run -n "${RANKS:-4}" examples/demo.py "$@"
status=$?
how_to_enter
exit $status
