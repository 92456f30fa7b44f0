# Sourced by the other scripts: sets PY to a Python that can run trident, installing what is missing.
#
# On a GPU machine whose python3 already has torch with CUDA and triton (nothing may be installed
# there), that python3 is used as it is, with the repository on PYTHONPATH.
# Elsewhere a virtualenv (.venv, or $TRIDENT_VENV) gets the CPU requirements (requirements/cpu.txt,
# or $TRIDENT_REQUIREMENTS) and trident itself, once.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if python3 -c "import torch, triton, cuda.bindings; assert torch.cuda.is_available()" 2>/dev/null; then
    PY=python3
    export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
else
    VENV="${TRIDENT_VENV:-$ROOT/.venv}"
    REQS="${TRIDENT_REQUIREMENTS:-$ROOT/requirements/cpu.txt}"
    STAMP="$VENV/.trident-$(basename "$REQS")"
    if [ ! -f "$STAMP" ]; then
        echo "setting up $VENV from $REQS (one time)..." >&2
        python3 -m venv "$VENV" || exit 1
        "$VENV/bin/python" -m pip install -q -r "$REQS" -e "$ROOT[test,bench]" || exit 1
        touch "$STAMP"
    fi
    PY="$VENV/bin/python"
fi
export PYTHONUNBUFFERED=1

# How to run `trident ...` by hand in this shell afterwards (the scripts' own shell ends with them).
how_to_enter() {
    if [ -n "${VENV:-}" ]; then
        echo "trident's commands (trident run, trident bench, ...) are in $VENV: enter it with" >&2
        echo "    source ${VENV#"$PWD"/}/bin/activate" >&2
    else
        echo "run trident's commands as: PYTHONPATH=$ROOT $PY -m trident run -n 4 ring.py" >&2
    fi
}
