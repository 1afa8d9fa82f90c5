"""The naive GPU baseline of the Triton backend's speed targets: a GGUF file loaded through
Hugging Face transformers' GGUF support (dequantized to bf16), eager, greedy decode of 128 tokens
after a 16-token prompt, single stream.  Prints tok/s.

    python tools/hf_decode_baseline.py MODEL.gguf [--compile]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path


def main(path: str, compile_: bool) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    p = Path(path)
    model = AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name,
                                                 torch_dtype=torch.bfloat16).cuda().eval()
    kwargs = {}
    if compile_:
        kwargs = {"cache_implementation": "static"}
        model.forward = torch.compile(model.forward, mode="reduce-overhead")
    ids = torch.randint(100, 1000, (1, 16), device="cuda")
    gen = dict(max_new_tokens=128, min_new_tokens=128, do_sample=False, **kwargs)
    model.generate(ids, **gen)  # warm-up (and compile)
    torch.cuda.synchronize()
    t = time.perf_counter()
    model.generate(ids, **gen)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t
    print(f"{p.name}: transformers bf16 {'static+compile' if compile_ else 'eager'} decode "
          f"{128 / dt:.1f} tok/s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], "--compile" in sys.argv[2:])
