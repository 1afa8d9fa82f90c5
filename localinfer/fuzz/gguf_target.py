"""One GGUF fuzz case: write the input as a file and load it as the loaders do.

The chain is what LLM() and the server's memory plan run before any weight is used:
open_gguf (header and layout checks), ModelConfig.from_gguf (metadata and vocabulary checks)
and check_tensors, the tokenizer built from the metadata, the chat template compiled and
rendered once, and model_info.describe (`localinfer info`). A LocalInferError is the clear
refusal it should be; any other exception is a crash.
"""

from __future__ import annotations

import os
import time
import traceback
from pathlib import Path

from localinfer.errors import LocalInferError
from localinfer.fuzz.gguf_encode import split_input

_MESSAGES = [{"role": "user", "content": "hi"}]


def write_case(data: bytes, path: Path) -> None:
    """The case file: the head, then its tail as a sparse hole."""
    head, tail = split_input(data)
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(len(head) + tail)


def load(path: Path) -> None:
    """Everything a loader checks; raises what the loaders would raise."""
    from localinfer.chat_template import ChatTemplate
    from localinfer.gguf_file import open_gguf
    from localinfer.model_config import SUPPORTED_ARCHITECTURES, ModelConfig
    from localinfer.model_info import describe
    from localinfer.tokenizer.factory import tokenizer_from_gguf

    with open_gguf(path) as g:
        config = ModelConfig.from_gguf(g, strict_arch=False)
        if config.arch in SUPPORTED_ARCHITECTURES:
            config.check_tensors(g)
        tokenizer = tokenizer_from_gguf(g.metadata)
        template = ChatTemplate.from_gguf(g.metadata, tokenizer)
        template.render(_MESSAGES)
    describe(path)


def run_case(data: bytes, path: Path) -> bool:
    """True if the file loads, False if it is refused with a clear error; raises otherwise."""
    write_case(data, path)
    try:
        load(path)
    except LocalInferError:
        return False
    finally:
        os.truncate(path, 0)  # the sparse tail: never left at its size between cases
    return True


def timed_case(data: bytes, path: Path) -> tuple[str, float, str]:
    """(outcome: "loads", "refused" or "crashes", seconds, what crashed)."""
    start = time.perf_counter()
    try:
        outcome, detail = ("loads" if run_case(data, path) else "refused"), ""
    except Exception as exc:  # a crash: reported, and the fuzzing goes on
        outcome = "crashes"
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        detail = (f"{type(exc).__name__}: {str(exc)[:200]} "
                  f"({Path(frame.filename).name}:{frame.lineno})")
    return outcome, time.perf_counter() - start, detail
