"""The one-process builder's encode pipeline: documents in batches, encoded on this thread or on a pool of
workers (builders/encode_pool.py), results in stream order. Each batch is cut into runs of about equal
characters, one call each on a worker; every document is encoded alone, so the ids do not depend on the cut.
"""

from __future__ import annotations

import itertools
import os
from collections import Counter, deque
from collections.abc import Iterable, Iterator

from niels_gpt.builders.encode_pool import EncodePool
from niels_gpt.errors import ConfigError
from niels_gpt.long_documents import encode_documents
from niels_gpt.seeds import TorchDraws
from niels_gpt.sources.documents import Skipped

ENCODE_BATCH_DOCS = 256  # documents per encode_batch call


def shuffled(items: Iterable, size: int | None, generator: TorchDraws) -> Iterator:
    """Approximate shuffle in O(size) memory: keep `size` items, emit a random one per new arrival. The draws are
    those of torch.randint(size, (4096,)) calls and a last torch.randperm on a torch.Generator (seeds.py)."""
    if not size or size <= 1:
        yield from items
        return
    buf: list = []
    draws: list[int] = []
    for item in items:
        if len(buf) < size:
            buf.append(item)
            continue
        if not draws:  # 4096 draws at a time: the same values as one at a time
            draws = generator.below(size, 4096)[::-1]
        j = draws.pop()
        yield buf[j]
        buf[j] = item
    for j in generator.permutation(len(buf)):
        yield buf[j]


def _read_batches(texts: Iterable, batch_docs: int = ENCODE_BATCH_DOCS) -> Iterator[tuple[list[str], Counter]]:
    """(non-empty documents, records skipped by reason) per batch of `batch_docs` items (str or Skipped) of the
    stream; an empty or whitespace-only document is skipped as `empty_document`."""
    it = iter(texts)
    while batch := list(itertools.islice(it, batch_docs)):
        kept = []
        skipped: Counter = Counter()
        for t in batch:
            if isinstance(t, str):
                if t and not t.isspace():  # what t.strip() tests, without copying the document
                    kept.append(t)
                else:
                    skipped["empty_document"] += 1
            elif isinstance(t, Skipped):
                skipped[t.reason] += 1
            else:
                raise ConfigError(f"documents must be str, got {type(t).__name__}: {t!r:.80}")
        yield kept, skipped


def _encoded_batches(texts: Iterable[str], tokenizer, pool, workers: int,
                     skipped: Counter) -> Iterator[list[list[int]]]:
    """Encoded documents, batch by batch, in stream order: on this thread without `pool`, else each batch cut
    into `pool.runs` runs (`_pieces`), `2 * workers` batches in flight. NOTE: runs, not whole batches, keep
    every core busy to the last batch. Skips are counted as their batch is consumed, so meta.json does not
    depend on how far ahead the workers have read."""
    batches = _read_batches(texts)
    if pool is None:
        encoded = ((encode_documents(tokenizer, kept, 1, arrays=True), n) for kept, n in batches)
    else:
        encoded = _in_order(pool, batches, workers)
    for docs, batch_skipped in encoded:
        # NOTE: the key is there (0 or more) once a batch is read, as meta.json has always recorded it
        skipped["empty_document"] += batch_skipped.pop("empty_document", 0)
        skipped.update(batch_skipped)
        yield docs


def _pieces(docs: list[str], n: int) -> list[list[str]]:
    """`docs` cut into at most `n` runs of consecutive documents of about equal characters."""
    if n <= 1 or len(docs) <= 1:
        return [docs]
    lengths = list(itertools.accumulate(map(len, docs)))
    step = lengths[-1] / n
    out: list[list[str]] = []
    start = 0
    for i, end in enumerate(lengths[:-1]):
        if end >= step * (len(out) + 1):
            out.append(docs[start:i + 1])
            start = i + 1
            if len(out) == n - 1:
                break
    out.append(docs[start:])
    return out


def _in_order(pool: EncodePool, batches, workers: int):
    pending: deque = deque()
    for batch in itertools.chain(batches, [None]):  # None: the end, where every pending batch is taken
        if batch is not None:
            pending.append(([pool.encode(piece) for piece in _pieces(batch[0], pool.runs)], batch[1]))
        while pending and (batch is None or len(pending) >= 2 * workers):
            futures, n = pending.popleft()
            yield [ids for future in futures for ids in future.result()], n


def _encode_threads(num_workers: int | None) -> int:
    """Encode threads: `num_workers`, or one per core for None."""
    workers = (os.cpu_count() or 1) if num_workers is None else num_workers
    if workers < 1:
        raise ConfigError(f"num_workers must be >= 1 (or None for one per core), got {num_workers}")
    return workers


