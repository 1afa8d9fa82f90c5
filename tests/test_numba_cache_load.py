"""A warm start loads the cached kernels without Numba's full context refresh (cache_load.py),
and the tokens are those of Numba's own loading path."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from localinfer.backends.numba_cpu.cache_load import lazy_refresh

CODE = textwrap.dedent("""
    import json, sys
    from localinfer.backends.numba_cpu import cache_load
    if sys.argv[2] == "numba":  # as if installed: Numba's own load_overload stays in place
        cache_load._installed = True
    from localinfer.llm import LLM
    from localinfer.sampling_params import SamplingParams
    llm = LLM(sys.argv[1], max_model_len=256, threads=1)
    out = llm.generate("The capital of France is", SamplingParams(max_tokens=12,
                                                                  temperature=0.0))
    print(json.dumps({"ids": out[0].token_ids,
                      "refreshed": "numba.np.linalg" in sys.modules}))
    llm.close()
""")


def _run(model: Path, how: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CODE, str(model), how], capture_output=True,
                         text=True, check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_deferred_refresh_is_installed_on_this_numba() -> None:
    """If a Numba upgrade moves the internals it patches, this fails instead of every start
    silently paying the refresh again."""
    assert lazy_refresh()


def test_warm_start_skips_the_refresh_and_gives_the_same_tokens(smollm2_path: Path) -> None:
    first = _run(smollm2_path, "numba")  # compiles if the cache is cold, else loads it
    reference = _run(smollm2_path, "numba")  # surely warm now: Numba's load path
    lazy = _run(smollm2_path, "lazy")
    assert reference["refreshed"]  # the marker module: only the full refresh imports it
    assert not lazy["refreshed"]
    assert lazy["ids"] == reference["ids"] == first["ids"] and len(lazy["ids"]) == 12
