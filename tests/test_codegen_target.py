"""A forced AVX2 path compiles for AVX2: no AVX-512 or VNNI instruction leaks into its code."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from localinfer.backends.numba_cpu.codegen_target import narrowed_features

# An explicit 16-lane vector, not an auto-vectorized loop: LLVM's vectorizer prefers 256-bit
# registers on Intel's AVX-512 cores (seen on a Xeon here), so a loop showed no zmm even unforced.
PROBE = r"""
import json
import numpy as np
import localinfer.backends.numba_cpu  # noqa: F401  (narrows the features, if forced)
from localinfer.backends.numba_cpu.isa import Isa
from localinfer.backends.numba_cpu.simd.vectors import vload_f32, vstore_f32
from localinfer.backends.numba_cpu.simd.vmath import vfma
from numba import njit
from numba.core.registry import cpu_target

@njit
def fma16(isa, a, out):  # one 16-lane vector: a zmm where AVX-512 is on, two ymm where not
    v = vload_f32(isa, a, 0)
    vstore_f32(out, 0, vfma(v, v, v))

a = np.ones(16, np.float32)
fma16(Isa("avx512", True), a, a.copy())
asm = fma16.inspect_asm(fma16.signatures[0])
print(json.dumps({"features": cpu_target.target_context.codegen()._tm_features,
                  "zmm": "zmm" in asm, "evex_bcast": "{1to" in asm}))
"""


def test_narrowed_features_keep_avx2_and_drop_avx512_and_vnni() -> None:
    host = {"avx2": True, "fma": True, "f16c": True, "avx512f": True, "avx512vnni": True,
            "avx512vl": True, "avxvnni": True, "evex512": True, "amx-int8": True, "sse4.2": True,
            "sha": False}
    got = set(narrowed_features(host, vnni=False).split(","))
    assert {"+avx2", "+fma", "+f16c", "+sse4.2", "-sha"} <= got
    assert {"-avx512f", "-avx512vnni", "-avx512vl", "-avxvnni", "-evex512", "-amx-int8"} <= got
    assert "+avxvnni" in narrowed_features(host, vnni=True).split(",")


def _probe(extra_env: dict[str, str]) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("LOCALINFER_ISA", "LOCALINFER_VNNI", "NUMBA_CPU_FEATURES")}
    env.update(extra_env)
    env["NUMBA_CACHE_DIR"] = ""  # the probe compiles; nothing of it needs keeping
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                         text=True, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_forced_avx2_compiles_without_avx512() -> None:
    import llvmlite.binding as ll

    if not ll.get_host_cpu_features().get("avx512f", False):
        pytest.skip("this CPU has no AVX-512: its own code already is the AVX2 path's")
    host = _probe({})
    assert "+avx512f" in host["features"].split(",")
    assert host["zmm"]  # a 16-lane vector is one 512-bit register for the host...
    forced = _probe({"LOCALINFER_ISA": "avx2", "LOCALINFER_VNNI": "0"})
    features = forced["features"].split(",")
    assert "-avx512f" in features and "+avx2" in features and "+fma" in features
    assert not forced["zmm"] and not forced["evex_bcast"]  # ...and two 256-bit ones here
    # with VNNI left on, the avx2 path's vpdpbusd ymm needs the host's features: unchanged
    assert "+avx512f" in _probe({"LOCALINFER_ISA": "avx2"})["features"].split(",")
