"""Parity of the Triton backend on this machine's GPU against the Numba backend on its CPU, for
the GGUF files given: teacher-forced logits of one prompt, top-1 agreement (where the Numba
backend's lead is >= 0.5) and mean / max KL, as in tests/test_numba_parity.py.

    python tools/cuda_parity.py MODEL.gguf ...
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from parity_checks import confident_mismatches, kl_per_position  # noqa: E402
from test_triton_models import prefill_logits  # noqa: E402
from test_triton_real_models import TEXT  # noqa: E402

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
        agree = (ref.argmax(1) == ours.argmax(1)).mean()
        differ = confident_mismatches(ref, ours).size
        kl = kl_per_position(ref, ours)
        ok = differ == 0 and kl.mean() <= 1e-2
        failed += not ok
        print(f"{Path(path).name}: {len(tokens)} positions, top-1 agreement {agree:.3f} "
              f"({differ} confident differ), mean KL {kl.mean():.2e}, max {kl.max():.2e} -> "
              f"{'ok' if ok else 'FAIL'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
