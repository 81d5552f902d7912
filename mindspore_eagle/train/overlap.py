"""Whether a training text repeats an evaluation text: the one rule the prompt sources and their tests share.

A training turn *overlaps* an evaluation text when

* it is the same text once normalised (``prompts.normalise``: lower case, punctuation dropped, whitespace
  collapsed): ``exact``; or
* at least half of the word 5-grams of the shorter of the two also occur in the other: ``near``. Measured against
  the shorter text so that containment counts: a ShareGPT turn that pastes an MT-Bench question inside a longer
  request, or a HumanEval stub with one line changed, is caught; two long texts sharing a stock phrase are not.

Texts of fewer than five words have no 5-grams and are only checked exactly. The evaluation texts are
``evalset.evaluation_turns()`` (all 160 MT-Bench turns, all 164 HumanEval prompts). The synthetic set is checked
by ``tests/test_train_overlap.py``; the ShareGPT source drops every conversation with an overlapping turn
(``train.sharegpt``).
"""

from __future__ import annotations

from typing import Sequence

from .prompts import normalise

NGRAM = 5
NEAR_SHARED = 0.5  # shared 5-grams / 5-grams of the shorter text


def ngrams(text: str) -> set[tuple[str, ...]]:
    """The word 5-grams of ``normalise(text)``; empty below five words."""
    words = normalise(text).split()
    return {tuple(words[i:i + NGRAM]) for i in range(max(0, len(words) - NGRAM + 1))}


class EvalOverlap:
    """An index of evaluation texts: ``match(text)`` is ``None`` or ``(kind, evaluation text)``, kind ``exact`` or
    ``near`` (rule in the module docstring). Candidates come from an inverted index of 5-grams, so a check costs
    the text's own 5-grams, not a pass over every evaluation text."""

    def __init__(self, evaluation: Sequence[str]):
        self.exact = {normalise(e): e for e in evaluation}
        self.texts = list(evaluation)
        self.grams = [ngrams(e) for e in self.texts]
        self.index: dict[tuple[str, ...], list[int]] = {}
        for j, grams in enumerate(self.grams):
            for g in grams:
                self.index.setdefault(g, []).append(j)

    def match(self, text: str) -> tuple[str, str] | None:
        hit = self.exact.get(normalise(text))
        if hit is not None:
            return "exact", hit
        grams = ngrams(text)
        for j in sorted({j for g in grams for j in self.index.get(g, ())}):
            other = self.grams[j]
            if len(grams & other) / max(1, min(len(grams), len(other))) >= NEAR_SHARED:
                return "near", self.texts[j]
        return None

    def overlaps(self, texts: Sequence[str]) -> list[tuple[str, str, str]]:
        """``(kind, text, evaluation text)`` for every text of ``texts`` that matches."""
        return [(m[0], t, m[1]) for t in texts for m in [self.match(t)] if m is not None]


__all__ = ["EvalOverlap", "NEAR_SHARED", "NGRAM", "ngrams"]
