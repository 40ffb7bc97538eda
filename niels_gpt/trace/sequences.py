"""A traced sample as the model saw it: {sample, input_ids[T], trained[T], documents}.

`trained[j]`: the target after position j entered the loss. A window of split tokens [s, s+T] holds a
document [d0, d1) at [max(d0, s) - s, min(d1, s+T) - s) of the sequence.
"""

from __future__ import annotations

import numpy as np

from niels_gpt.constants import IGNORE_INDEX
from niels_gpt.packing import collate_packed
from niels_gpt.trace.documents import cache_documents, document_origin, packed_origin


def _window(cache: str, split: str, shard: int, offset: int, T: int, **extra) -> dict:
    """The window at token `offset` of `shard` (the split's shards back to back)."""
    docs = cache_documents(cache, split)
    start = docs.shard_starts[shard] + offset
    tokens = docs.tokens(start, start + T + 1)
    documents = []
    for d in docs.overlapping(start, start + T).tolist():
        a, b = max(int(docs.starts[d]), start) - start, min(int(docs.ends[d]), start + T) - start
        documents.append({**extra, **document_origin(cache, split, d), "sequence_tokens": [a, b], "trained_tokens": b - a})
    return {"input_ids": tokens[:T].tolist(), "trained": [True] * T, "documents": documents,
            "window": {"cache": cache, "split": split, "cache_tokens": [start, start + T + 1]}}


def sequence(replay, sample) -> dict:
    """The sequence of one sample id of `replay` (a Replay)."""
    kind, T = replay.kind, replay.T
    if kind in ("indexed", "shards"):
        out = _window(replay.data, "train", *replay.dataset.locate(int(sample)), T)
    elif kind == "mixture":
        d, i = sample
        name, ds = replay.dataset.names[d], replay.dataset.datasets[d]
        out = _window(str(replay.opened[0].origins[d]), ds.split, *ds.locate(int(i)), T, dataset=name)
        sample = [name, int(i)]
    elif kind == "windows":
        out = _window(replay.data, "train", *sample, T)
        sample = out["window"]["cache_tokens"][0]
    elif kind == "sft":
        out = _example(replay, int(sample))
    else:
        out = _bin(replay, int(sample))
    return {"sample": sample, **out}


def _example(replay, i: int) -> dict:
    T, ds = replay.T, replay.dataset
    x, _, y_masked = ds.collate(np.array([i]))
    trained = (y_masked[0] != IGNORE_INDEX).tolist()
    origin = document_origin(replay.data, "train", i)
    n = min(origin["cache_tokens"][1] - origin["cache_tokens"][0], T)
    doc = {**origin, "sequence_tokens": [0, n], "trained_tokens": int(sum(trained[:n]))}
    return {"input_ids": x[0].tolist(), "trained": trained, "documents": [doc]}


def packed_documents(dataset, b: int) -> list[tuple[int, int, int]]:
    """[(sequence number in the bins, start, end)] of bin b's sequences."""
    a = dataset._open() if hasattr(dataset, "_open") else None
    item = dataset[b]
    bounds = np.asarray(item["seq_boundaries"]).tolist()
    first = int(a["seq_offsets"][b]) if a is not None and "seq_offsets" in a else None
    return [((first + j) if first is not None else None, bounds[j], bounds[j + 1]) for j in range(len(bounds) - 1)]


def _bin(replay, b: int) -> dict:
    T, ds = replay.T, replay.dataset
    batch = collate_packed([ds[b]], pad_to=T)
    trained = (batch["labels"][0] != IGNORE_INDEX).tolist()
    source = str((getattr(ds, "manifest", {}) or {}).get("source", {}).get("cache_dir", "")) or None
    documents = []
    for j, (seq, a, b2) in enumerate(packed_documents(ds, b)):
        documents.append({"cache": replay.data, "split": "train", "document": seq, "bin": b, "sequence": j,
                          "bin_tokens": [a, b2], "source_cache": source, "input": None,
                          "note": "the bins do not record which example of their SFT cache this sequence is",
                          **packed_origin(replay.data, ds, seq),
                          "sequence_tokens": [a, b2], "trained_tokens": int(sum(trained[a:b2]))})
    return {"input_ids": batch["input_ids"][0].tolist(), "trained": trained, "documents": documents}
