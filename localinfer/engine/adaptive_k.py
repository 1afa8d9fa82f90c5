"""AdaptiveK: how many tokens one sequence guesses per step, learned from its verifications.

Every guess costs a token of the step whether or not it is accepted, so a sequence guesses
only as far as its recent guesses held:

- it starts at the configured K (prompt lookup is right often or not at all);
- a verification that accepted every guess doubles k (up to K): copying runs are long;
- one that rejected a guess after a accepted ones sets k to a + 1, and at least one less
  than before: the guesses held about that far;
- after MISSES_TO_PAUSE verifications in a row that accepted nothing, the sequence stops
  guessing for `backoff` of its steps (k = 0), then probes again with one guess; each pause
  is twice as long as the one before (up to MAX_BACKOFF), and any accepted guess resets it.

So free text, where lookup rarely hits, soon costs nothing, and a sequence that starts to
repeat its input (or itself) is found again within MAX_BACKOFF steps.
"""

from __future__ import annotations

from dataclasses import dataclass

MISSES_TO_PAUSE = 3
MIN_BACKOFF = 8
MAX_BACKOFF = 128


@dataclass(slots=True)
class AdaptiveK:
    max_k: int
    k: int = -1  # -1: not set yet, max_k
    misses: int = 0  # verifications in a row that accepted nothing
    paused: int = 0  # steps left without guessing
    backoff: int = MIN_BACKOFF  # length of the next pause

    def __post_init__(self) -> None:
        if self.k < 0:
            self.k = self.max_k

    def want(self) -> int:
        """Guesses to ask for this step (one call per step the sequence decodes in)."""
        if self.paused:
            self.paused -= 1
            return 0
        return self.k

    def record(self, proposed: int, accepted: int) -> None:
        """A verification of `proposed` guesses accepted the first `accepted`."""
        if accepted:
            self.misses = 0
            self.backoff = MIN_BACKOFF
        if accepted == proposed:
            self.k = min(self.max_k, 2 * self.k)
            return
        self.k = max(1, min(self.k - 1, accepted + 1))
        if accepted == 0:
            self.misses += 1
            if self.misses >= MISSES_TO_PAUSE:
                self.misses = 0
                self.paused = self.backoff
                self.backoff = min(MAX_BACKOFF, 2 * self.backoff)
                self.k = 1
