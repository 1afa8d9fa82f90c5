#!/bin/sh
# localinfer offline bundle launcher (written by `localinfer bundle create`).
#   ./run.sh                 chat with the bundled model
#   ./run.sh run "PROMPT"    any localinfer command; the bundled model is the default
set -eu
HERE=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd)
PY=${LOCALINFER_PYTHON:-}
if [ -z "$PY" ]; then
    for candidate in python3 python; do
        if command -v "$candidate" >/dev/null 2>&1; then PY=$candidate; break; fi
    done
fi
if [ -z "$PY" ]; then
    echo "run.sh: no python3 found: install Python 3.10 or newer, or set LOCALINFER_PYTHON" >&2
    exit 1
fi
TAG=$("$PY" "$HERE/check.py" --target)
if [ ! -f "$HERE/wheels/$TAG/requirements.lock" ]; then
    echo "run.sh: this bundle has no wheels for $TAG (it has: $(ls "$HERE/wheels" | tr '\n' ' '));" \
         "use one of those Pythons (LOCALINFER_PYTHON=...) or build the bundle with --platform/--python" >&2
    exit 1
fi
STATE="$HERE/.runtime"
if ! mkdir -p "$STATE" 2>/dev/null || [ ! -w "$STATE" ]; then
    STATE="${XDG_CACHE_HOME:-$HOME/.cache}/localinfer-bundles/@BUNDLE_ID@"
    mkdir -p "$STATE"
fi
# state made for another folder or machine (a bundle zipped after use, then copied) is never
# used: its venv points elsewhere and its compiled kernels are another CPU's
OWNER=$("$PY" "$HERE/check.py" --owner "$HERE")
if [ -e "$STATE/owner" ] && [ "$(cat "$STATE/owner")" != "$OWNER" ]; then
    echo "run.sh: $STATE was made on another machine or in another folder: starting over" >&2
    rm -rf "$STATE"
    mkdir -p "$STATE"
fi
printf '%s\n' "$OWNER" > "$STATE/owner"
VENV="$STATE/venv-$TAG"
export LOCALINFER_HOME="$STATE/home" LOCALINFER_MODEL=@DEFAULT_MODEL@
@SYSTEM_SH@
if [ ! -f "$VENV/.complete" ]; then
    echo "first run: checking the bundle's files" >&2
    "$PY" "$HERE/check.py" "$HERE"
    echo "first run: making a Python environment from the bundle's wheels (offline)" >&2
    rm -rf "$VENV"
    if ! "$PY" -m venv "$VENV"; then
        echo "run.sh: $PY cannot make a venv (on Debian or Ubuntu: apt install python3-venv)" >&2
        exit 1
    fi
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir \
        --no-index --find-links "$HERE/wheels/$TAG" --require-hashes \
        -r "$HERE/wheels/$TAG/requirements.lock"
    # setup talks on stderr: `./run.sh run PROMPT > answer.txt` holds the answer only
    "$VENV/bin/localinfer" bundle install "$HERE" --skip-check >&2
    "$VENV/bin/localinfer" bundle verify "$HERE" --smoke --skip-check >&2 ||
        echo "run.sh: warning: this machine's kernels answer the demo prompts differently" \
             "from the machine that built the bundle (details above)" >&2
    touch "$VENV/.complete"
fi
if [ $# -eq 0 ]; then
    exec "$VENV/bin/localinfer" chat
fi
exec "$VENV/bin/localinfer" "$@"
