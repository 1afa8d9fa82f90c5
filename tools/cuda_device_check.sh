#!/usr/bin/env bash
# The Triton backend's checks on a lent NVIDIA GPU (the `device` tool), as one prepared script.
#
#   here:   tools/cuda_device_check.sh prepare        # fills .whl/ and .models/ (git-ignored)
#   there:  run(command="bash tools/cuda_device_check.sh run", carry=[".whl", ".models"],
#               timeout_s=600)
#
# `run`: installs the carried wheels the GPU image lacks and localinfer itself; runs the Triton
# kernel and model tests on the GPU (tests/triton_env.py picks it); parity of real SmolLM2
# weights cut to 2 blocks against the Numba backend on the same machine; generates full-size
# models of the real shapes and types (random weights, tests/gguf_shapes.py) and benches
# `--backend triton` on them (CUDA graphs on, then off) next to transformers' bf16 baseline.
# Everything it prints also lands in $OUT/log.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-run}" = prepare ]; then
  set -e
  for d in /.whl/ /.models/; do grep -qx "$d" .git/info/exclude || echo "$d" >> .git/info/exclude; done
  mkdir -p .whl .models
  plat="--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp $plat -d .whl gguf llguidance platformdirs tomli
  m=~/.cache/localinfer/models
  .venv/bin/python tests/gguf_cut.py $m/smollm2-135m/*.gguf .models/smollm2-cut2.gguf 2
  for name in smollm2-135m qwen2.5-coder-0.5b qwen2.5-coder-1.5b; do
    .venv/bin/python tests/gguf_shapes.py describe $m/$name/*.gguf .models/$name.shapes.gguf
  done
  du -shc .whl .models
  exit 0
fi

OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
exec > >(tee "$OUT/log") 2>&1
export PYTHONUNBUFFERED=1 LOCALINFER_HOME=/tmp/li-home
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -m localinfer info .models/smollm2-cut2.gguf | grep backends

echo "== kernel and model tests on the GPU"
timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/test_triton_relayout.py \
  tests/test_triton_linear.py tests/test_triton_attention.py tests/test_triton_models.py

echo "== parity: real SmolLM2 weights (2 blocks), Triton on the GPU vs Numba on the CPU"
timeout 120 python3 tools/cuda_parity.py .models/smollm2-cut2.gguf

echo "== speed on full-size models of the real shapes (random weights)"
for name in qwen2.5-coder-0.5b qwen2.5-coder-1.5b smollm2-135m; do
  python3 tests/gguf_shapes.py fill .models/$name.shapes.gguf /tmp/$name.gguf || continue
  timeout 150 python3 -m localinfer bench --model /tmp/$name.gguf --backend triton --peer none \
    --quick --aggregate 1,16,64 --json "$OUT/bench-$name.json"
  LOCALINFER_CUDA_GRAPHS=0 timeout 90 python3 -m localinfer bench --model /tmp/$name.gguf \
    --backend triton --peer none --quick --aggregate 1,64 | grep -i "decode"
  timeout 120 python3 tools/hf_decode_baseline.py /tmp/$name.gguf
done
