"""AdaptiveK: how many tokens one sequence guesses per step, learned from its verifications.

Every guess costs a token of the step whether or not it is accepted, so a sequence guesses
only as far as its recent guesses held:

- it starts at the configured K (prompt lookup is right often or not at all);
- a verification that accepted every guess doubles k (up to K): copying runs are long;
- one that rejected a guess after a accepted ones sets k to a + 1, and at least one less
  than before: the guesses held about that far;
- a verification's gain is the guesses it accepted minus what they cost, in target steps: the
  extra positions the step computed (VERIFY_COST a guess, or what speculator.py measured)
  plus the proposer's time (a draft model's forward passes) over a plain step's
  (speculator.py measures both; an n-gram lookup's is nil); it is a loss when it accepted
  nothing or when the running gain (an average over the last few verifications) has fallen
  below zero (below MARGIN for a draft model), so a draft whose single accepted guesses only
  pay back the rejected rounds' cost also counts as losing;
- a cheap proposer's k is rounded up (within K) so that the sequence's 1 + k tokens fill the
  runner's token groups (ModelRunner.token_group: 4 on the Numba vpdpbusd paths, where a
  step of 4 tokens costs about what one of 2 does and less than one of 3): one guess becomes
  three and five become seven, and after a rejection the copying run is found again in
  fewer steps (3 -> 3 -> 7 -> K guesses instead of 1 -> 2 -> 4 -> K); a draft model pays
  a forward pass per guess, so its k is never rounded;
- after MISSES_TO_PAUSE losses in a row, the sequence stops guessing for `backoff` of its
  steps (k = 0; a draft model's first pause is DRAFT_MIN_BACKOFF), then probes again with
  one guess (a draft's probe that loses pauses it again at once); each pause is twice as long
  as the one before (up to MAX_BACKOFF), and a verification that paid resets it.

So free text, where lookup rarely hits, soon costs nothing, and a sequence that starts to
repeat its input (or itself) is found again within MAX_BACKOFF steps.
"""

from __future__ import annotations

from dataclasses import dataclass

MISSES_TO_PAUSE = 3
# what a guessed position adds to a step, in plain steps (a 9-token step of Qwen2.5-Coder-0.5B
# costs 1.8x a 1-token one on 2 cores: 0.1 a guess)
VERIFY_COST = 0.1
# the running gain a draft-model sequence must keep, in tokens a verification: what the cost
# model does not see (a draft's catch-up after a pause, the probes, Python around the
# proposer) makes break-even drafting a loss in practice (the 1.5B's story with the 0.5B
# drafting ran at 0.95x plain with its gain hovering about 0). A lookup's cost is the
# verifying step's alone, which is measured: it keeps guessing while the gain is >= 0 (with
# the margin the 1.5B's code edit gave 1.91x, without it 2.08x).
MARGIN = 0.25
MIN_BACKOFF = 8
# a draft model's probe first catches up with every token of the pause (a forward pass over
# them) besides its guess: dear, so its pauses start longer (the 1.5B's story with the 0.5B
# drafting paused and probed 5 times in 200 tokens from 8 steps)
DRAFT_MIN_BACKOFF = 32
MAX_BACKOFF = 128


@dataclass(slots=True)
class AdaptiveK:
    max_k: int
    k: int = -1  # -1: not set yet, max_k
    misses: int = 0  # losses in a row: verifications that accepted less than they cost
    paused: int = 0  # steps left without guessing
    # the proposer runs a model (a draft): every round costs its forward passes, which the
    # cost model sees only in part, and a probe first catches up with the whole pause
    dear: bool = False
    backoff: int = -1  # length of the next pause (-1: not set yet, min_backoff)
    verifications: int = 0
    net: float = 0.0  # running gain per verification (tokens beyond their cost), an average
    probing: bool = False  # the verifications since a pause have not paid yet
    group: int = 1  # the runner's token_group: 1 + k is rounded up to a multiple of it

    def __post_init__(self) -> None:
        if self.k < 0:
            self.k = self.max_k
        if self.backoff < 0:
            self.backoff = self.min_backoff

    @property
    def min_backoff(self) -> int:
        return DRAFT_MIN_BACKOFF if self.dear else MIN_BACKOFF

    def want(self) -> int:
        """Guesses to ask for this step (one call per step the sequence decodes in)."""
        if self.paused:
            self.paused -= 1
            return 0
        if self.group <= 1 or self.dear:
            return self.k
        return min(self.max_k, -(-(self.k + 1) // self.group) * self.group - 1)

    def record(self, proposed: int, accepted: int, proposer_steps: float = 0.0,
               guess_cost: float = VERIFY_COST) -> None:
        """A verification of `proposed` guesses accepted the first `accepted`; making them
        took the proposer `proposer_steps` plain target steps' worth of time, and each
        guessed position added `guess_cost` of a step to the verifying step."""
        self.verifications += 1
        gain = accepted - (guess_cost * proposed + proposer_steps)
        # the first verification, and a probe after a pause, start the average afresh
        fresh = self.verifications == 1 or self.probing
        self.net = gain if fresh else 0.7 * self.net + 0.3 * gain
        loss = accepted == 0 or self.net < (MARGIN if self.dear else 0.0)
        if not loss:
            self.misses = 0
            self.backoff = self.min_backoff
            self.probing = False
        if accepted == proposed and not loss:
            self.k = min(self.max_k, 2 * self.k)
            return
        self.k = max(1, min(self.k - 1, accepted + 1))
        if loss:
            self.misses += 1
            # a draft's probe that loses pauses it again at once (a lookup's probe costs a
            # guessed position: it gets MISSES_TO_PAUSE, as at any time)
            if self.misses >= MISSES_TO_PAUSE or (self.probing and self.dear):
                self.misses = 0
                self.probing = True
                self.paused = self.backoff
                self.backoff = min(MAX_BACKOFF, 2 * self.backoff)
                self.k = 1
