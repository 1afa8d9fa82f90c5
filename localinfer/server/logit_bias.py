"""OpenAI's `logit_bias`: {"token id": bias} with biases in [-100, 100], checked against the
model's vocabulary before anything is generated (the engine adds them to the logits)."""

from __future__ import annotations

import math
from typing import Any

from localinfer.sampling_params import MAX_LOGIT_BIAS
from localinfer.server.protocol import invalid

MAX_BIASED_TOKENS = 1024  # OpenAI caps the map too (300); a bound keeps a request cheap


def parse_logit_bias(value: Any, n_vocab: int | None) -> dict[int, float] | None:
    """The map as token id -> bias; None when absent or empty. n_vocab None: ids are checked
    by the engine instead (a 400 without a param then)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid("logit_bias", "'logit_bias' must be an object mapping token ids (as "
                      "strings) to biases between -100 and 100")
    if len(value) > MAX_BIASED_TOKENS:
        raise invalid("logit_bias", f"'logit_bias' may bias at most {MAX_BIASED_TOKENS} tokens, "
                      f"got {len(value)}")
    bias: dict[int, float] = {}
    for key, amount in value.items():
        token = _token_id(key)
        if token is None or (n_vocab is not None and token >= n_vocab):
            vocab = f" in [0, {n_vocab})" if n_vocab is not None else ""
            raise invalid("logit_bias", f"logit_bias: {key!r} is not a token id{vocab}",
                          code="invalid_tokens")
        if (isinstance(amount, bool) or not isinstance(amount, (int, float))
                or not math.isfinite(amount) or abs(amount) > MAX_LOGIT_BIAS):
            raise invalid("logit_bias", f"logit_bias: the bias of token {key} must be a number "
                          f"between -{MAX_LOGIT_BIAS:g} and {MAX_LOGIT_BIAS:g}, got {amount!r}")
        bias[token] = float(amount)
    return bias or None


def _token_id(key: str) -> int | None:
    # JSON object keys are strings: "50256"; no sign, no spaces, no "1e3"
    if not key.isascii() or not key.isdigit() or len(key) > 12:
        return None
    return int(key)
