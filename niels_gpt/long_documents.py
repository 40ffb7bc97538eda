"""Encoding documents of any length with bounded memory, ids exactly those of the whole document.

Encoders build ~30 bytes of working structures per input character, so a document longer than
`LONG_DOCUMENT_CHARS` is encoded in pieces, cut only before a single space between non-space characters:
neither sentencepiece (split by whitespace, no dummy prefix) nor the byte-level regexes (GPT-2, cl100k,
o200k) make a pre-token that crosses such a space, so for BPE models the pieces' ids concatenated are the
document's (tests/test_long_documents.py). NOTE: a unigram model breaks rare score ties by float sums from
its input's start, so a few boundaries near a cut may move (same decoded text; counts in docs/scale.md).
A document with no such space is encoded whole. Pieces become arrays as they come (4 bytes an id), by the fast
encoder where the tokenizer has one (tokenizer/fast.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

LONG_DOCUMENT_CHARS = 4 << 20  # pieces of about 4 Mi characters: ~120 MB of encoder memory each


def split_points(text: str, piece_chars: int | None = None) -> list[int]:
    """Offsets at which `text` may be cut (each before a single space between non-space characters)."""
    piece_chars = piece_chars or LONG_DOCUMENT_CHARS
    cuts: list[int] = []
    start = 0
    while len(text) - start > piece_chars:
        cut = _safe_space(text, start + piece_chars, start)
        if cut is None:
            break  # no safe place left: the rest is encoded whole
        cuts.append(cut)
        start = cut
    return cuts


def _safe_space(text: str, target: int, start: int) -> int | None:
    """A safe cut at or before `target` (searching back to `start`), else after it, else None."""
    end = target + 1
    while True:
        pos = text.rfind(" ", start + 1, end)
        if pos <= start:
            break
        if _safe_at(text, pos):
            return pos
        end = pos  # look before this space next
    pos = target
    while True:
        pos = text.find(" ", pos + 1)
        if pos < 0 or pos >= len(text) - 1:
            return None
        if _safe_at(text, pos):
            return pos


def _safe_at(text: str, pos: int) -> bool:
    return 0 < pos < len(text) - 1 and not text[pos - 1].isspace() and not text[pos + 1].isspace()


def encode_documents(tokenizer, texts: Sequence[str], num_threads: int | None = 1,
                     piece_chars: int | None = None, arrays: bool = False, batch: bool = False) -> list:
    """Ids of each text: a list of ints, or an array (`encode_long`) for a text longer than `piece_chars`.
    `arrays=True`: uint32 arrays for the short texts where the tokenizer (or the fast encoder) has them.
    `batch`: the fast encoder's batch calls (FastEncoder.encode_arrays); the ids are the same."""
    piece_chars = piece_chars or LONG_DOCUMENT_CHARS
    short = [i for i, t in enumerate(texts) if len(t) <= piece_chars]
    out = [None if len(t) <= piece_chars else encode_long(tokenizer, t, piece_chars, batch) for t in texts]
    whole = encode_whole(tokenizer, [texts[i] for i in short], num_threads, arrays, batch)
    for i, ids in zip(short, whole, strict=True):
        out[i] = ids
    return out


def encode_whole(tokenizer, texts: Sequence[str], num_threads: int | None = 1, arrays: bool = True,
                 batch: bool = False) -> list:
    """Ids of each text, encoded whole: by the fast encoder where it is checked to give the tokenizer's ids
    (tokenizer/fast.py), else by the tokenizer's batch encoder (`encode_batch_arrays` with `arrays`)."""
    as_arrays = getattr(tokenizer, "encode_batch_arrays", None) if arrays else None

    def reference(some):
        return as_arrays(some) if as_arrays else tokenizer.encode_batch(some, num_threads=num_threads)

    fast = _checked_fast(tokenizer, texts)
    if fast is None:
        return reference(texts)
    ids = fast.encode_arrays(texts, batch)
    left = [i for i, a in enumerate(ids) if a is None]  # texts gigatoken cannot take (lone surrogates)
    for i, a in zip(left, reference([texts[i] for i in left]) if left else [], strict=True):
        ids[i] = np.asarray(a, dtype=np.uint32)
    return ids if arrays else [a.tolist() for a in ids]


def _checked_fast(tokenizer, texts: Sequence[str]):
    """The tokenizer's fast encoder, given its sample check on `texts` (once a process), or None."""
    # lazy: the tokenizer package is not needed to cut documents (and imports this module's users)
    from niels_gpt.tokenizer.fast import check_sample, fast_encoder

    fast = fast_encoder(tokenizer)
    return check_sample(tokenizer, fast, texts) if fast is not None and texts else fast


def encode_long(tokenizer, text: str, piece_chars: int | None = None, batch: bool = False) -> np.ndarray:
    """One long document, piece by piece (see the module docstring): a uint32 array where the fast encoder
    (tokenizer/fast.py) encoded every piece, else an int32 array."""
    piece_chars = piece_chars or LONG_DOCUMENT_CHARS
    bounds = [0, *split_points(text, piece_chars), len(text)]
    fast = _checked_fast(tokenizer, [text])
    parts = []
    wide = False
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        # NOTE: the fast encoder's ids are the reference's for any text it takes (checked), so for a piece too;
        # without it a 100 MB text file was encoded by the tokenizer's own library, 20-60x slower
        ids = fast.encode_arrays([text[a:b]], batch)[0] if fast is not None else None
        if ids is not None:
            parts.append(ids)
            continue
        ids = tokenizer.encode(text[a:b])
        try:
            parts.append(np.array(ids, dtype=np.int64 if wide else np.int32))
        except OverflowError:  # never for a real tokenizer; kept wide so the writer's range check names it
            wide = True
            parts.append(np.array(ids, dtype=np.int64))
    # one piece at least; pieces of several dtypes (some fast, some not: a lone surrogate in one) give int64
    return np.concatenate(parts)
