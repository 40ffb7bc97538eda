"""Encoding documents of any length with bounded memory, ids exactly those of the whole document.

sentencepiece and the regex pre-tokenizers of byte-level BPE (GPT-2, cl100k, o200k) build working
structures of ~30 bytes per input character, so one 200 MB line used to peak at 6.2 GB. A document longer
than `LONG_DOCUMENT_CHARS` is encoded in pieces of about that size, cut only before a single space that
has a non-space character on both sides:

- sentencepiece (ours: identity normalization, no dummy prefix, split by whitespace) never makes a piece
  that crosses such a space, since every pre-token starts at a space;
- the byte-level regexes only match a space at the start of a pre-token when the character before it is
  not whitespace, so a pre-token always starts at such a space and nothing before it looks past it.

So for BPE models (sentencepiece BPE, byte-level BPE) the pieces' ids, concatenated, are the document's
ids (tests/test_long_documents.py checks this on real text with several piece sizes). A sentencepiece
*unigram* model, such as the contract's, picks among equally scored segmentations by float sums
accumulated from the start of its input, so a rare tie can segment differently near a cut ("p|ale" for
"pa|le"), still decoding to the same text: on tinyshakespeare (489,446 tokens) 2 token boundaries move
with 1 Mi-character pieces, 76 with 4,096-character ones. Only documents
longer than `LONG_DOCUMENT_CHARS` (4 Mi characters) take this path; every shorter one is encoded whole. A document with no such space (a 200 MB base64
blob) is encoded whole. Pieces are converted to int32 arrays as they come, so the ids of a long document
cost 4 bytes each instead of a Python list's ~36.
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
    n = len(text)
    while n - start > piece_chars:
        target = start + piece_chars
        cut = _safe_space(text, target, start)
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
                     piece_chars: int | None = None, arrays: bool = False) -> list:
    """Ids of each text: a list of ints, or an int32 array for a text longer than `piece_chars`.

    arrays=True: a tokenizer with `encode_batch_arrays` (tiktoken) gives its uint32 arrays for the short
    texts instead of lists (the same ids without a Python int per token; the cache builder's writer takes
    either). The fast encoder (niels_gpt/tokenizer/fast.py) encodes them where it is checked to give the same
    ids."""
    piece_chars = piece_chars or LONG_DOCUMENT_CHARS
    if all(len(t) <= piece_chars for t in texts):
        return encode_whole(tokenizer, texts, num_threads, arrays)
    out: list = [None] * len(texts)
    short = [i for i, t in enumerate(texts) if len(t) <= piece_chars]
    for i, ids in zip(short, encode_whole(tokenizer, [texts[i] for i in short], num_threads, arrays),
                       strict=True):
        out[i] = ids
    for i, text in enumerate(texts):
        if out[i] is None:
            out[i] = encode_long(tokenizer, text, piece_chars)
    return out


def encode_whole(tokenizer, texts: Sequence[str], num_threads: int | None = 1, arrays: bool = True) -> list:
    """Ids of each text, encoded whole: by the fast encoder where it is checked to give the tokenizer's ids
    (niels_gpt/tokenizer/fast.py; uint32 arrays), else by the tokenizer's own batch encoder on `num_threads`
    (lists, or its uint32 arrays where it has `encode_batch_arrays` and `arrays` is set)."""
    # lazy: the tokenizer package is not needed to cut documents (and imports this module's users)
    from niels_gpt.tokenizer.fast import check_sample, fast_encoder

    as_arrays = getattr(tokenizer, "encode_batch_arrays", None) if arrays else None

    def reference(some):
        return as_arrays(some) if as_arrays else tokenizer.encode_batch(some, num_threads=num_threads)

    fast = fast_encoder(tokenizer)
    if fast is not None and texts:
        fast = check_sample(tokenizer, fast, texts)
    if fast is None:
        return reference(texts)
    ids = fast.encode_arrays(texts)
    left = [i for i, a in enumerate(ids) if a is None]  # texts gigatoken cannot take (lone surrogates)
    for i, a in zip(left, reference([texts[i] for i in left]) if left else [], strict=True):
        ids[i] = np.asarray(a, dtype=np.uint32)
    return ids if arrays else [a.tolist() for a in ids]


def encode_long(tokenizer, text: str, piece_chars: int | None = None) -> np.ndarray:
    """One long document, piece by piece (see the module docstring), as an int32 array."""
    piece_chars = piece_chars or LONG_DOCUMENT_CHARS
    bounds = [0, *split_points(text, piece_chars), len(text)]
    parts = []
    wide = False
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        ids = tokenizer.encode(text[a:b])
        try:
            parts.append(np.array(ids, dtype=np.int64 if wide else np.int32))
        except OverflowError:  # never for a real tokenizer; kept wide so the writer's range check names it
            wide = True
            parts = [p.astype(np.int64) for p in parts] + [np.array(ids, dtype=np.int64)]
    return np.concatenate(parts) if parts else np.zeros(0, np.int32)
