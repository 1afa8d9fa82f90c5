"""Demo prompts: greedy token ids recorded when a bundle is built, replayed by `verify --smoke`.

Matching bytes prove the files arrived; matching tokens prove that the kernels on the target
compute what they computed on the building machine. A prompt is generated alone, exactly as
`localinfer run PROMPT -n MAX_TOKENS` would (same chat template, system prompt, greedy), so the
launcher's `./run.sh run PROMPT` prints the recorded text.

Kernels for another ISA add in another order, so logits differ in the last bits, and where two
tokens are almost tied the greedy choice may flip (seen: SmolLM2 on NEON ended a sentence with
EOS where AVX-512 went on, the two 0.02 logits apart). So the replay asks more than equal ids
where it can and less where it must: each recorded token's log-probability must agree within
LOGPROB_TOLERANCE, and the runs may part only at a near tie — where the recorded top two were
less than NEAR_TIE apart and this machine picked the recorded runner-up. Anything else fails.
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
LOGPROB_TOLERANCE = 0.5  # nats, per recorded token
NEAR_TIE = 0.1  # logits (= nats) between the recorded top two


@dataclass(slots=True)
class DemoPrompt:
    model: str  # the bundle's model name
    prompt: str
    system: str | None
    max_tokens: int
    token_ids: list[int]
    text: str
    logprobs: list[float]  # of each token
    runner_up: list[int]  # the second most likely token at each step
    margins: list[float]  # logprob(token) - logprob(runner_up)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DemoPrompt:
        try:
            p = cls(model=str(data["model"]), prompt=str(data["prompt"]),
                    system=data.get("system"), max_tokens=int(data["max_tokens"]),
                    token_ids=[int(t) for t in data["token_ids"]], text=str(data["text"]),
                    logprobs=[float(x) for x in data["logprobs"]],
                    runner_up=[int(t) for t in data["runner_up"]],
                    margins=[float(x) for x in data["margins"]])
        except (KeyError, TypeError, ValueError) as exc:
            raise BundleError(f"manifest: bad demo prompt entry: {exc}") from exc
        if not len(p.token_ids) == len(p.logprobs) == len(p.runner_up) == len(p.margins):
            raise BundleError("manifest: a demo prompt's token and logprob lists differ in length")
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
    """Greedy generation of each prompt alone on the Numba backend, with the top two
    log-probabilities of every step."""
    from localinfer.llm import LLM
    from localinfer.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=2)
    out = []
    with LLM(str(model_path), progress=progress) as llm:
        for prompt in prompts:
            d = DemoPrompt(model, prompt, system, max_tokens, [], "", [], [], [])
            for o in llm.stream(llm.request(prompt, system), params):
                d.text += o.text
                d.token_ids += o.token_ids
                for lp in o.logprobs or []:
                    (_, best), (second, second_lp) = lp.top[0], lp.top[1]
                    d.logprobs.append(round(lp.logprob, 5))
                    d.runner_up.append(second)
                    d.margins.append(round(best - second_lp, 5))
            out.append(d)
    return out


def compare(want: DemoPrompt, got: DemoPrompt) -> tuple[bool, str]:
    """(passed, what happened) for one replayed prompt (the policy in the module docstring)."""
    n = next((i for i, (a, b) in enumerate(zip(want.token_ids, got.token_ids, strict=False))
              if a != b), min(len(want.token_ids), len(got.token_ids)))
    worst = max((abs(a - b) for a, b in zip(want.logprobs[:n], got.logprobs[:n], strict=True)),
                default=0.0)
    if worst > LOGPROB_TOLERANCE:
        return False, (f"the tokens' log-probabilities differ from the recorded ones by up to "
                       f"{worst:.3f} (tolerance {LOGPROB_TOLERANCE})")
    if n == len(want.token_ids) == len(got.token_ids):
        return True, f"{n} tokens match the recorded ones (logprobs within {worst:.4f})"
    if n < len(want.token_ids) and n < len(got.token_ids) and want.margins[n] < NEAR_TIE \
            and got.token_ids[n] == want.runner_up[n]:
        return True, (f"{n} tokens match the recorded ones, then a near tie (the top two "
                      f"{want.margins[n]:.3f} apart) went the other way")
    return False, (f"token {n} differs from the recorded run: got {got.text!r}, "
                   f"recorded {want.text!r}")


def replay(model_path: Path, demos: list[DemoPrompt], *, progress: bool) -> list[str]:
    """One line per prompt whose answer differs from the recorded one ([] = all agree)."""
    if not demos:
        return []
    fresh = generate(model_path, demos[0].model, [d.prompt for d in demos], demos[0].system,
                     demos[0].max_tokens, progress=progress)
    problems = []
    for want, got in zip(demos, fresh, strict=True):
        passed, what = compare(want, got)
        line = f"smoke: {want.model}: {want.prompt!r}: {what}"
        if not passed:
            problems.append(line)
        elif progress:
            print(line, file=sys.stderr)
    return problems
