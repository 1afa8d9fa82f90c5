"""`localinfer imatrix MODEL TEXTFILE -o FILE`: an importance matrix in llama.cpp's GGUF imatrix
format, for `localinfer quantize --imatrix FILE` (or llama-quantize --imatrix)."""

from __future__ import annotations

import argparse


def add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="GGUF model (llama family), ideally the unquantized source")
    p.add_argument("text", help="UTF-8 calibration text")
    p.add_argument("-o", "--output", required=True, help="imatrix file to write (GGUF)")
    p.add_argument("--chunk", type=int, default=512,
                   help="tokens per chunk, each run from position 0 (default 512)")
    p.add_argument("--no-progress", action="store_true", help="do not draw progress bars")


def main(name: str, args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    from localinfer.catalog import Catalog
    from localinfer.progress import ProgressBar
    from localinfer.quant import imatrix
    from localinfer.quant.quality import read_text

    text = read_text(args.text)
    model = Catalog.load().resolve(args.model)
    with ProgressBar(None, "imatrix layers", enabled=False if args.no_progress else None,
                     unit="layers") as bar:
        def step(done: int, total: int) -> None:
            bar.total = total
            bar.update(1)

        im = imatrix.compute(model, text, args.chunk, dataset=Path(args.text).name,
                             progress=step)
    imatrix.save(im, args.output)
    print(f"{args.output}: {len(im.sums)} matrices, {im.chunk_count} chunks of "
          f"{im.chunk_size} tokens", file=sys.stderr)
    return 0
