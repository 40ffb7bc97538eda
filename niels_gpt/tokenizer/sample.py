"""The text a tokenizer trainer reads, either trainer; with `--max-chars N`, a deterministic sample of
documents from the whole input, each cut to its first `--doc-chars` characters (nanochat's 10,000-character
cap per document, so that a few huge documents do not dominate the counts).

Bottom-k sampling in one pass: document i draws key_i from random.Random(seed) in stream order; the sample
is the documents of the smallest keys whose capped texts fit in N characters (a heap popped at its largest
key while over N), given back in stream order. Every part of the input has the same chance whatever its
position, and only the sample is held in memory.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterable, Iterator

from niels_gpt.errors import TokenizerError

DOC_CHARS = 10_000  # characters kept of each document when sampling (nanochat's doc_cap)


class NoTrainingText(TokenizerError):
    """The training text was empty or whitespace only: a trainer has nothing to learn from."""


def sample_documents(texts: Iterable[str], max_chars: int, doc_chars: int = DOC_CHARS, seed: int = 0,
                     stats: dict | None = None) -> Iterator[str]:
    """The sample (module docstring) of `texts`; `stats` gets the documents read and kept."""
    rng = random.Random(seed)
    heap: list[tuple[float, int, str]] = []  # (-key, index, text): heap[0] is the largest key
    total = read = 0
    for i, text in enumerate(texts):
        read += 1
        key = rng.random()
        text = text[:doc_chars]
        if total + len(text) > max_chars and heap and -heap[0][0] < key:
            continue  # it would be the first to go
        heapq.heappush(heap, (-key, i, text))
        total += len(text)
        while total > max_chars and heap:
            total -= len(heapq.heappop(heap)[2])
    if stats is not None:
        stats.update(sampled_from_documents=read, sampled_documents=len(heap), sampled_characters=total)
    for _, _, text in sorted(heap, key=lambda e: e[1]):
        yield text


class TrainingTexts:
    """The texts a trainer reads (the `--max-chars` sample when asked for), stopped once `max_train_chars`
    characters were read, counted into `stats` (documents, characters, truncated_at_max_train_chars);
    `visible`: whether any text held a character that is not whitespace. Iterated once."""

    def __init__(self, texts: Iterable[str], settings, stats: dict):
        self.texts, self.settings, self.stats, self.visible = texts, settings, stats, False

    def __iter__(self) -> Iterator[str]:
        s, stats = self.settings, self.stats
        sample = self.texts if s.max_chars is None else sample_documents(self.texts, s.max_chars, s.doc_chars,
                                                                         s.seed, stats)
        for text in sample:
            if stats["characters"] >= s.max_train_chars:
                stats["truncated_at_max_train_chars"] = True
                return
            stats["documents"] += 1
            stats["characters"] += len(text)
            self.visible = self.visible or (text != "" and not text.isspace())
            yield text

    def nothing_visible(self) -> NoTrainingText:
        """The error to raise when no text held a visible character."""
        if self.stats["documents"] == 0:
            return NoTrainingText("no training text: every source was empty; give text to train on")
        return NoTrainingText(f"no training text: the {self.stats['documents']:,} document(s) hold only "
                              f"whitespace ({self.stats['characters']:,} characters); give text to train on")

    def surrogate(self, exc: UnicodeEncodeError, near: str = "") -> TokenizerError:
        """A lone surrogate in the text, which no UTF-8 text (and no trainer) can hold."""
        return TokenizerError(f"training text, {near}document {self.stats['documents']:,}: a lone surrogate "
                              f"({exc.object[exc.start:exc.end]!r}) that no UTF-8 text can hold; fix the "
                              "text (e.g. text.encode('utf-8', 'replace').decode() replaces it)")
