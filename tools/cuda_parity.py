"""Parity of the Triton backend on this machine's GPU against the Numba backend on its CPU, for
the GGUF files given: teacher-forced logits of one prompt, top-1 agreement (where the Numba
backend's lead is >= 0.5) and mean / max KL, as in tests/test_numba_parity.py.

    python tools/cuda_parity.py MODEL.gguf ...
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from test_triton_models import prefill_logits  # noqa: E402
from test_triton_real_models import TEXT, log_softmax  # noqa: E402

from localinfer.llm import LLM  # noqa: E402


def main(paths: list[str]) -> int:
    failed = 0
    for path in paths:
        logits = {}
        for backend in ("numba", "triton"):
            llm = LLM(path, backend=backend, kv_cache_mb=64, max_model_len=512)
            tokens = llm.encode(TEXT * 4)
            logits[backend] = prefill_logits(llm, tokens)
            llm.close()
        ref, ours = logits["numba"], logits["triton"]
        top2 = np.sort(ref, axis=1)[:, -2:]
        confident = top2[:, 1] - top2[:, 0] >= 0.5
        agree = (ref.argmax(1) == ours.argmax(1))
        lr, lo = log_softmax(ref), log_softmax(ours)
        kl = (np.exp(lr) * (lr - lo)).sum(axis=1)
        ok = bool(agree[confident].all()) and kl.mean() <= 1e-2
        failed += not ok
        print(f"{Path(path).name}: {len(tokens)} positions, top-1 agreement {agree.mean():.3f} "
              f"({int((~agree & confident).sum())} confident differ), mean KL {kl.mean():.2e}, "
              f"max {kl.max():.2e} -> {'ok' if ok else 'FAIL'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
