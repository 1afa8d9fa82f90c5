"""Demo prompts: greedy token ids recorded when a bundle is built, replayed by `verify --smoke`.

Matching bytes prove the files arrived; matching tokens prove that the kernels on the target
compute what they computed on the building machine. A prompt is generated alone, exactly as
`localinfer run PROMPT -n MAX_TOKENS` would (same chat template, system prompt, greedy), so the
launcher's `./run.sh run PROMPT` prints the recorded text.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from localinfer.errors import BundleError

DEFAULT_PROMPT = "Name a colour."
DEFAULT_MAX_TOKENS = 32


@dataclass(slots=True)
class DemoPrompt:
    model: str  # the bundle's model name
    prompt: str
    system: str | None
    max_tokens: int
    token_ids: list[int]
    text: str

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DemoPrompt:
        try:
            p = cls(model=str(data["model"]), prompt=str(data["prompt"]),
                    system=data.get("system"), max_tokens=int(data["max_tokens"]),
                    token_ids=[int(t) for t in data["token_ids"]], text=str(data["text"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise BundleError(f"manifest: bad demo prompt entry: {exc}") from exc
        return p

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def read_prompts(path: Path | None) -> list[str]:
    """--prompts FILE: one prompt per line (blank lines and '#' comments skipped), or, in a
    .json file, a list of strings; without a file, the default demo prompt."""
    if path is None:
        return [DEFAULT_PROMPT]
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BundleError(f"cannot read --prompts {path}: {exc}") from exc
    if path.suffix.lower() == ".json":
        try:
            prompts = json.loads(text)
        except ValueError as exc:
            raise BundleError(f"--prompts {path}: invalid JSON: {exc}") from exc
        if not (isinstance(prompts, list) and all(isinstance(p, str) for p in prompts)):
            raise BundleError(f"--prompts {path}: a JSON file must hold a list of strings")
    else:
        prompts = [ln.strip() for ln in text.splitlines()
                   if ln.strip() and not ln.lstrip().startswith("#")]
    if not prompts:
        raise BundleError(f"--prompts {path}: no prompts")
    return prompts


def generate(model_path: Path, model: str, prompts: list[str], system: str | None,
             max_tokens: int, *, progress: bool) -> list[DemoPrompt]:
    """Greedy generation of each prompt alone on the Numba backend."""
    from localinfer.llm import LLM
    from localinfer.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    out = []
    with LLM(str(model_path), progress=progress) as llm:
        for prompt in prompts:
            result = llm.generate(llm.request(prompt, system), params)[0]
            out.append(DemoPrompt(model, prompt, system, max_tokens, result.token_ids,
                                  result.text))
    return out


def replay(model_path: Path, demos: list[DemoPrompt], *, progress: bool) -> list[str]:
    """One line per prompt whose tokens differ from the recorded ones ([] = all match)."""
    if not demos:
        return []
    fresh = generate(model_path, demos[0].model, [d.prompt for d in demos], demos[0].system,
                     demos[0].max_tokens, progress=progress)
    problems = []
    for want, got in zip(demos, fresh, strict=True):
        if got.token_ids == want.token_ids:
            if progress:
                print(f"smoke: {want.model}: {want.prompt!r}: {len(got.token_ids)} tokens "
                      "match the recorded ones", file=sys.stderr)
            continue
        pairs = zip(want.token_ids, got.token_ids, strict=False)
        at = next((i for i, (a, b) in enumerate(pairs) if a != b),
                  min(len(want.token_ids), len(got.token_ids)))
        problems.append(f"smoke: {want.model}: {want.prompt!r}: token {at} differs from the "
                        f"recorded run: got {got.text!r}, recorded {want.text!r}")
    return problems
