#!/usr/bin/env bash
# The smoke run of a linux-aarch64 bundle on this x86_64 machine: the bundle's own aarch64
# wheels (hash-checked, offline) installed into a folder, then `localinfer bundle verify
# --smoke` in tools/arm64_qemu.sh's arm64 Python under qemu-user (a Neoverse N1, NEON + SDOT).
#
#   tools/bundle_arm64_smoke.sh BUNDLE_DIR [HOST_PYTHON]
#
# Emulated, the first compile of the kernels takes minutes (408 s for SmolLM2 on a Zen 5 host),
# so this is a manual check, not a CI test.
set -euo pipefail
BUNDLE=$(cd "$1" && pwd)
HOST_PY="${2:-python3}"
ROOT=$(tools/arm64_qemu.sh "$HOST_PY" | tail -1 | xargs dirname | xargs dirname)
TAG=linux-aarch64-cp311
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$HOST_PY" -m pip install --quiet --disable-pip-version-check --no-cache-dir --target "$WORK/site" \
    --no-index --find-links "$BUNDLE/wheels/$TAG" --require-hashes \
    -r "$BUNDLE/wheels/$TAG/requirements.lock" --platform manylinux_2_28_aarch64 \
    --python-version 3.11 --implementation cp --only-binary=:all:
cd "$WORK"  # not a checkout: its localinfer/ would shadow the installed one
time env -i PATH=/usr/bin:/bin PYTHONPATH="$WORK/site" PYTHONNOUSERSITE=1 \
    NUMBA_CPU_NAME=neoverse-n1 LOCALINFER_HOME="$WORK/home" \
    qemu-aarch64-static -cpu neoverse-n1 -L "$ROOT" "$ROOT/usr/bin/python3.11" \
    -m localinfer bundle verify "$BUNDLE" --smoke
