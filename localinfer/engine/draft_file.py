"""draft_file(): the GGUF a draft model runs from: the file itself, or a copy requantized to
Q4_0 once and kept in the cache.

Why: the target verifies every guess, so a draft's precision only moves how many guesses are
accepted, while its speed is paid on every guess. One token through the 0.5B Qwen2.5-Coder
(its catalog file is mostly Q5_0) took 23 ms a guess on 2 cores of an AVX-512 host, 14 ms as
Q4_0, whose kernels do the least work per weight; drafting for the 1.5B, code generation went
from 1.49x to 2.16x plain decoding, with as many guesses accepted (77% -> 82%).

Policy:
- a file whose quantized weights are all Q4_0 runs as it is, and so does any file when
  LOCALINFER_DRAFT_REQUANT=0 (a draft whose every guess should be its own file's);
- otherwise its Q4_0 copy (every weight Q4_0: `localinfer quantize --type Q4_0 --pure`) is
  made once, a few seconds for a 0.5B, in `drafts/` beside the repacked-weight cache, named by
  the source's sha256 (remembered per path and stat, as the weight cache does), written
  atomically, and used by every later load; removing the model removes it
  (weight_cache.forget).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from localinfer import paths

log = logging.getLogger("localinfer.engine")
DRAFT_TYPE = "Q4_0"


def enabled() -> bool:
    return os.environ.get("LOCALINFER_DRAFT_REQUANT", "1").lower() not in (
        "0", "off", "no", "false")


def drafts_dir() -> Path:
    return paths.weight_cache_dir() / "drafts"


def copy_path(digest: str) -> Path:
    return drafts_dir() / f"{digest}.{DRAFT_TYPE}.gguf"


def draft_file(path: Path, progress: bool | None = None) -> Path:
    """The file to run the draft at `path` from (module docstring). `progress`: show the
    copy being made (None: when stderr is a terminal)."""
    if not enabled() or _already_fast(path):
        return path
    from localinfer.file_digest import file_digest
    from localinfer.quant.quantizer import quantize_file
    from localinfer.weight_cache import digests_dir, prune_dead

    digest, previous = file_digest(path, digests_dir())
    if previous is not None:  # the file at this path changed: its old copy is dead
        copy_path(previous).unlink(missing_ok=True)
    target = copy_path(digest)
    if target.exists():
        return target
    if progress is None:
        progress = sys.stderr.isatty()
    notice = f"draft model {path.name}: making its {DRAFT_TYPE} copy for speed, once ({target})"
    log.info("%s", notice)
    if progress:
        print(notice, file=sys.stderr)
    try:
        drafts_dir().mkdir(parents=True, exist_ok=True)
        quantize_file(path, target, DRAFT_TYPE, pure=True, progress=progress,
                      warn=lambda message: None)  # requantizing is the point here
    except OSError as exc:  # a full or read-only disk: the draft runs from its own file
        log.warning("draft model %s runs unconverted: its %s copy could not be written (%s)",
                    path.name, DRAFT_TYPE, exc)
        return path
    prune_dead()  # copies of files deleted since (a test's temporary models) go too
    return target


def _already_fast(path: Path) -> bool:
    from localinfer.ggml_types import GGMLQuantizationType
    from localinfer.gguf_file import open_gguf

    with open_gguf(path) as g:
        weights = [t for t in g.tensors.values() if len(t.shape) == 2]
    return bool(weights) and all(t.ggml_type == GGMLQuantizationType.Q4_0 for t in weights)
