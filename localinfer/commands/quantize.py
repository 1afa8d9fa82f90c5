"""`localinfer quantize INPUT OUTPUT --type TYPE`: a GGUF quantizer byte-identical to llama.cpp."""

from __future__ import annotations

import argparse


def add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="GGUF file in F32/F16/BF16 (a quantized one is dequantized first)")
    p.add_argument("output", help="GGUF file to write (written atomically)")
    p.add_argument("--type", "-t", required=True, metavar="TYPE",
                   help="F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K_S/M/L, Q4_K_S/M, "
                        "Q5_K_S/M, Q6_K (Q3_K, Q4_K, Q5_K mean the _M mixes, as in llama.cpp)")
    p.add_argument("--threads", type=int, default=None, help="threads (default: all cores)")
    p.add_argument("--pure", action="store_true",
                   help="every quantizable tensor gets TYPE's tensor type (no mix rules)")
    p.add_argument("--no-progress", action="store_true", help="do not draw progress bars")


def main(name: str, args: argparse.Namespace) -> int:
    import sys

    import numba

    from localinfer.errors import InvalidRequestError
    from localinfer.quant.quantizer import quantize_file

    if args.threads is not None:
        if not 1 <= args.threads <= numba.config.NUMBA_NUM_THREADS:
            raise InvalidRequestError(
                f"--threads must be between 1 and {numba.config.NUMBA_NUM_THREADS}")
        numba.set_num_threads(args.threads)
    report = quantize_file(args.input, args.output, args.type, pure=args.pure,
                           progress=False if args.no_progress else None)
    mb = report.src_bytes / 1e6
    print(f"{args.output}: {report.ftype}, {len(report.tensors)} tensors, "
          f"{mb:.1f} MB -> {report.dst_bytes / 1e6:.1f} MB in {report.seconds:.1f} s "
          f"({mb / max(report.seconds, 1e-9):.0f} MB/s)"
          + (f", {report.fallbacks} fallback types" if report.fallbacks else ""),
          file=sys.stderr)
    return 0
