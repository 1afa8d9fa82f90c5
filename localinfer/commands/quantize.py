"""`localinfer quantize INPUT OUTPUT --type TYPE`: a GGUF quantizer byte-identical to llama.cpp.

INPUT is a GGUF file or a Hugging Face model directory (converted first, quant/hf_convert/).
Options: --imatrix uses an importance matrix (`localinfer imatrix`), --eval prints a quality
report of the output against the input, --register adds the output to the user's catalog.
"""

from __future__ import annotations

import argparse
from pathlib import Path

BUILTIN_TEXT = ""  # --eval without a file: the built-in sample


def add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="GGUF file in F32/F16/BF16 (a quantized one is dequantized "
                                 "first) or a Hugging Face model directory (llama, qwen2, gemma3)")
    p.add_argument("output", help="GGUF file to write (written atomically)")
    p.add_argument("--type", "-t", required=True, metavar="TYPE",
                   help="F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K_S/M/L, Q4_K_S/M, "
                        "Q5_K_S/M, Q6_K (Q3_K, Q4_K, Q5_K mean the _M mixes, as in llama.cpp)")
    p.add_argument("--threads", type=int, default=None, help="threads (default: all cores)")
    p.add_argument("--pure", action="store_true",
                   help="every quantizable tensor gets TYPE's tensor type (no mix rules)")
    p.add_argument("--imatrix", metavar="FILE", default=None,
                   help="importance matrix (GGUF, from `localinfer imatrix` or llama-imatrix) "
                        "that weights the quantization error")
    p.add_argument("--eval", nargs="?", const=BUILTIN_TEXT, default=None, metavar="TEXTFILE",
                   help="after quantizing, compare output to input on TEXTFILE (or, without a "
                        "file, a built-in English sample): perplexities, KL, top-1 agreement")
    p.add_argument("--eval-ctx", type=int, default=512, metavar="N",
                   help="tokens per evaluation window (default 512)")
    p.add_argument("--register", metavar="NAME", default=None,
                   help="add the output to your catalog as NAME (localinfer run --model NAME)")
    p.add_argument("--no-progress", action="store_true", help="do not draw progress bars")


def main(name: str, args: argparse.Namespace) -> int:
    import os

    # Threads waiting at the end of a parallel region sleep instead of spinning: a busy
    # machine (or more threads than free cores) otherwise loses the cores to spinning workers
    # (2 threads measured 2-3x slower than 1 here). Read when numba starts its threads.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import numba

    from localinfer.errors import InvalidRequestError

    if args.threads is not None:
        if not 1 <= args.threads <= numba.config.NUMBA_NUM_THREADS:
            raise InvalidRequestError(
                f"--threads must be between 1 and {numba.config.NUMBA_NUM_THREADS}")
        numba.set_num_threads(args.threads)
    text = None
    if args.eval is not None:  # read it now: a missing text file should fail before the work
        from localinfer.quant.quality import read_text

        text = read_text(args.eval or None)
    if args.register is not None:
        from localinfer.user_catalog import check_name

        check_name(args.register)
    progress = False if args.no_progress else None
    source = Path(args.input)
    if not source.is_dir():
        _run(args, source, text, progress)
        return 0
    # A Hugging Face directory: convert next to the output first, into a locked temp folder
    # (atomic_file.temp_dir) that goes on exit, or in the next sweep if this process is killed.
    from localinfer.atomic_file import temp_dir
    from localinfer.quant.hf_convert import convert_hf_dir
    from localinfer.quant.quantizer import resolve_ftype

    resolve_ftype(args.type)  # a bad --type fails before the conversion
    out = Path(args.output)
    with temp_dir(out.parent, f"{out.name}.hf-source") as folder:
        _run(args, convert_hf_dir(source, folder / "source.gguf"), text, progress)
    return 0


def _run(args: argparse.Namespace, source: Path, text: str | None,
         progress: bool | None) -> None:
    import sys

    from localinfer.quant.quantizer import quantize_file

    report = quantize_file(source, args.output, args.type, pure=args.pure,
                           imatrix=args.imatrix, progress=progress)
    mb = report.src_bytes / 1e6
    print(f"{args.output}: {report.ftype}, {len(report.tensors)} tensors, "
          f"{mb:.1f} MB -> {report.dst_bytes / 1e6:.1f} MB in {report.seconds:.1f} s "
          f"({mb / max(report.seconds, 1e-9):.0f} MB/s)"
          + (f", {report.fallbacks} fallback types" if report.fallbacks else "")
          + (f", imatrix for {report.imatrix_used} tensors" if report.imatrix_used else ""),
          file=sys.stderr)
    if args.register is not None:
        from localinfer.user_catalog import register

        entry = register(args.register, args.output)
        print(f"registered {entry.name!r} -> {args.output}", file=sys.stderr)
    if text is not None:
        from localinfer.quant.quality import compare

        q = compare(source, args.output, text, ctx=args.eval_ctx, threads=args.threads,
                    progress=progress)
        print(q.format("source", report.ftype))
