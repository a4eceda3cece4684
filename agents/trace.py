"""What a learning negotiator records of its own episode: one token sequence, which tokens it wrote, and the
log-probabilities it sampled them with. Plain data (no torch): the market hands it back, training consumes it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TokenTrace:
    """One side's episode as token ids of its model: the first prompt, then everything after it, where ``mask`` is 1
    on the ids the negotiator generated itself (trained) and 0 on what the environment added (context only).
    ``logprobs`` holds the sampling log-probability of every own id (0 elsewhere)."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    mask: tuple[int, ...]
    logprobs: tuple[float, ...]

    def __post_init__(self) -> None:
        if not len(self.completion_ids) == len(self.mask) == len(self.logprobs):
            raise ValueError(
                f"a trace needs one mask bit and one log-probability per completion id; got {len(self.completion_ids)}"
                f" ids, {len(self.mask)} mask bits and {len(self.logprobs)} log-probabilities"
            )

    @property
    def own_tokens(self) -> int:
        return sum(self.mask)

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)
