#!/usr/bin/env bash
# An arm64 (AArch64) Python for the NEON kernel tests on an x86_64 Debian host, run under
# qemu-user emulation: Debian's arm64 python3.11 unpacked into a directory (no chroot, no
# binfmt_misc), plus aarch64 wheels of the packages the kernels need, at the host's versions.
#
#   tools/arm64_qemu.sh [HOST_PYTHON]
#
# Idempotent: a second run with the same versions only prints.  Prints the launcher
# (ROOT/bin/python, a script that starts the arm64 python under qemu-aarch64-static) on its
# last line.  ROOT: $LOCALINFER_ARM64_ROOT, default ~/.cache/localinfer/arm64-root.
# Installing qemu-user-static and enabling the arm64 apt architecture need root (CI runs as
# root); on a host that already has both, any user can build the root.
#
# The emulated CPU is a Neoverse N1 (ARMv8.2-A with dotprod and fp16, like AWS Graviton2):
# qemu emulates exactly its instructions, and NUMBA_CPU_NAME tells LLVM to compile for it
# (inside qemu-user, /proc/cpuinfo is the x86 host's, so LLVM would otherwise see "generic").
set -euo pipefail

HOST_PY="${1:-python3}"
ROOT="${LOCALINFER_ARM64_ROOT:-$HOME/.cache/localinfer/arm64-root}"
CPU=neoverse-n1
PYVER=3.11

# the host's versions of the packages the kernels and their tests import
versions=$("$HOST_PY" - <<'EOF'
from importlib.metadata import version
print(" ".join(f"{p}=={version(p)}" for p in ("numpy", "numba", "llvmlite", "gguf")))
EOF
)
# pure-Python extras the tiny end-to-end check imports (jinja2's chat templates, paths)
extras="jinja2 markupsafe platformdirs"
stamp="$CPU $PYVER $versions $extras"

if [[ -x "$ROOT/bin/python" && -f "$ROOT/.stamp" && "$(cat "$ROOT/.stamp")" == "$stamp" ]]; then
    echo "$ROOT/bin/python"
    exit 0
fi

need_root() {
    if [[ $(id -u) != 0 ]]; then
        echo "arm64_qemu.sh: $1 needs root (run it as root once)" >&2
        exit 1
    fi
}

if ! command -v qemu-aarch64-static >/dev/null; then
    need_root "installing qemu-user-static"
    # a fresh machine's package lists may be stale or absent: update once and retry
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user-static >/dev/null ||
        { apt-get update -qq &&
          DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user-static >/dev/null; }
fi
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    need_root "enabling the arm64 apt architecture"
    dpkg --add-architecture arm64
    apt-get update -qq
elif ! apt-cache show "python$PYVER:arm64" >/dev/null 2>&1; then
    need_root "apt-get update"
    apt-get update -qq
fi

rm -rf "$ROOT"
mkdir -p "$ROOT/debs" "$ROOT/bin"
# python3.11 and the shared libraries it, numpy's and llvmlite's wheels link against
debs=(libc6 libgcc-s1 libstdc++6 gcc-12-base zlib1g libbz2-1.0 liblzma5 libexpat1 libffi8
      libcrypt1 libssl3 libuuid1 libsqlite3-0 libdb5.3 libncursesw6 libtinfo6 libreadline8
      libnsl2 libtirpc3 libgssapi-krb5-2 libk5crypto3 libkrb5-3 libkrb5support0 libkeyutils1
      libcom-err2 "libpython$PYVER-minimal" "libpython$PYVER-stdlib" "python$PYVER-minimal"
      "python$PYVER")
(cd "$ROOT/debs" && apt-get download -qq -o APT::Sandbox::User=root "${debs[@]/%/:arm64}" media-types)
for deb in "$ROOT"/debs/*.deb; do
    dpkg-deb -x "$deb" "$ROOT"
done
rm -rf "$ROOT/debs"

"$HOST_PY" -m pip install --quiet --disable-pip-version-check --no-compile --no-deps \
    --target "$ROOT/site" --implementation cp --python-version "$PYVER" --only-binary=:all: \
    --platform manylinux2014_aarch64 --platform manylinux_2_17_aarch64 \
    --platform manylinux_2_28_aarch64 $versions $extras pyyaml tqdm

mkdir -p "$ROOT/numba-cache"
cat > "$ROOT/bin/python" <<EOF
#!/bin/sh
# arm64 python $PYVER under qemu-user ($CPU); written by tools/arm64_qemu.sh
export PYTHONPATH="$ROOT/site\${PYTHONPATH:+:\$PYTHONPATH}" PYTHONNOUSERSITE=1
export NUMBA_CACHE_DIR="\${NUMBA_CACHE_DIR:-$ROOT/numba-cache}" NUMBA_CPU_NAME=$CPU
exec qemu-aarch64-static -cpu $CPU -L "$ROOT" "$ROOT/usr/bin/python$PYVER" "\$@"
EOF
chmod +x "$ROOT/bin/python"
"$ROOT/bin/python" -c "import numba, numpy, gguf, jinja2" >/dev/null
echo "$stamp" > "$ROOT/.stamp"
echo "$ROOT/bin/python"
