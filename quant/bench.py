"""Quantization speed, ours vs llama.cpp, on the same input file and thread count.

    python -m localinfer.quant.bench MODEL.gguf --types Q8_0,Q4_K_M --threads 2

MB/s is input bytes per second of wall time for the whole file (read, convert, write, fsync).
Each side runs once untimed first (our Numba kernels load from the cache; the OS page cache
warms up), then the best of --repeat runs counts.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from .mixes import FTYPES
from .quantizer import quantize_file, resolve_ftype


def _best(fn: Callable[[], None], repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m localinfer.quant.bench")
    p.add_argument("model")
    p.add_argument("--types", default="Q8_0,Q4_K_M")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as `localinfer quantize` does
    import llama_cpp
    import numba

    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    size_mb = Path(args.model).stat().st_size / 1e6
    print(f"{args.model}: {size_mb:.0f} MB, {args.threads} threads")
    print(f"{'type':<8} {'localinfer MB/s':>16} {'llama.cpp MB/s':>15} {'ratio':>6}")
    quiet = llama_cpp.llama_log_callback(lambda *a: None)  # keep a reference while it is set
    llama_cpp.llama_log_set(quiet, None)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.gguf"
        for name in args.types.split(","):
            ftype = resolve_ftype(name)

            def ours(ftype: str = ftype) -> None:
                quantize_file(args.model, out, ftype, progress=False)

            def theirs(ftype: str = ftype) -> None:
                params = llama_cpp.llama_model_quantize_default_params()
                params.ftype = FTYPES[ftype][0]
                params.nthread = args.threads
                params.allow_requantize = True
                if llama_cpp.llama_model_quantize(args.model.encode(), str(out).encode(),
                                                  params):
                    raise RuntimeError("llama_model_quantize failed")

            a = size_mb / _best(ours, args.repeat)
            b = size_mb / _best(theirs, args.repeat)
            print(f"{ftype:<8} {a:>16.0f} {b:>15.0f} {a / b:>5.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
