"""The one-process builder's encode pipeline: documents in batches, encoded on this thread or on a pool of
workers (builders/encode_pool.py), results in stream order. With a pool, each run of documents reaching
ENCODE_RUN_CHARS goes to a worker as soon as it is read, so encoding starts with the first run, not the first
whole batch, and the last batch leaves little behind; every document is encoded alone, so the ids do not depend
on the cut.
"""

from __future__ import annotations

import itertools
import os
from collections import Counter, deque
from collections.abc import Iterable, Iterator

from niels_gpt.errors import ConfigError
from niels_gpt.long_documents import encode_documents
from niels_gpt.seeds import TorchDraws
from niels_gpt.sources.documents import Skipped

ENCODE_BATCH_DOCS = 256  # documents a batch: the unit in which skipped records are counted
ENCODE_RUN_CHARS = 1 << 20  # with a pool: a run of a batch's documents goes to a worker once it has this many


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


def _read_batches(texts: Iterable, submit=None) -> Iterator[tuple[list, Counter]]:
    """(non-empty documents, records skipped by reason) per batch of ENCODE_BATCH_DOCS items (str or Skipped) of
    the stream; an empty or whitespace-only document is skipped as `empty_document`. With `submit`, each run of
    documents reaching ENCODE_RUN_CHARS (and the batch's last) is passed to it as soon as it is read, and a batch
    is the list of what it returned."""
    it = iter(texts)
    while True:
        kept: list = []
        runs: list = []
        skipped: Counter = Counter()
        read = chars = 0
        for t in itertools.islice(it, ENCODE_BATCH_DOCS):
            read += 1
            if isinstance(t, str):
                if t and not t.isspace():  # what t.strip() tests, without copying the document
                    kept.append(t)
                    chars += len(t)
                else:
                    skipped["empty_document"] += 1
            elif isinstance(t, Skipped):
                skipped[t.reason] += 1
            else:
                raise ConfigError(f"documents must be str, got {type(t).__name__}: {t!r:.80}")
            if submit is not None and chars >= ENCODE_RUN_CHARS:
                runs.append(submit(kept))
                kept, chars = [], 0
        if not read:
            return
        if submit is not None and (kept or not runs):
            runs.append(submit(kept))
        yield (kept if submit is None else runs), skipped


def _encoded_batches(texts: Iterable[str], tokenizer, pool, workers: int,
                     skipped: Counter) -> Iterator[list[list[int]]]:
    """Encoded documents, batch by batch, in stream order: on this thread without `pool`, else each batch's runs
    on its workers as they are read, `2 * workers` batches in flight. Skips are counted as their batch is
    consumed, so meta.json does not depend on how far ahead the workers have read."""
    if pool is None:
        encoded = ((encode_documents(tokenizer, kept, 1, arrays=True), n) for kept, n in _read_batches(texts))
    else:
        encoded = _in_order(_read_batches(texts, pool.encode), workers)
    for docs, batch_skipped in encoded:
        # NOTE: the key is there (0 or more) once a batch is read, as meta.json has always recorded it
        skipped["empty_document"] += batch_skipped.pop("empty_document", 0)
        skipped.update(batch_skipped)
        yield docs


def _in_order(batches, workers: int):
    pending: deque = deque()
    for batch in itertools.chain(batches, [None]):  # None: the end, where every pending batch is taken
        if batch is not None:
            pending.append(batch)
        while pending and (batch is None or len(pending) >= 2 * workers):
            futures, n = pending.popleft()
            yield [ids for future in futures for ids in future.result()], n


def _encode_threads(num_workers: int | None) -> int:
    """Encode threads: `num_workers`, or one per core for None."""
    workers = (os.cpu_count() or 1) if num_workers is None else num_workers
    if workers < 1:
        raise ConfigError(f"num_workers must be >= 1 (or None for one per core), got {num_workers}")
    return workers


