"""`trace_document`: the steps (rank, micro-batch, row) whose sequences held a document.

The document becomes the sample ids holding any of its tokens. Global orders (indexed, shards, packed):
one np.isin per epoch's order slice; random windows, SFT and mixtures: each micro-batch's draws replayed;
Parquet: the rank's loader makes every batch again.
"""

from __future__ import annotations

import numpy as np

from niels_gpt.constants import SPLITS
from niels_gpt.errors import ConfigError
from niels_gpt.trace.documents import cache_documents, find_document
from niels_gpt.trace.replay import advance, parquet_hits, parquet_origin
from niels_gpt.trace.steps import Run, packed_documents, replay_of


def parse_document(text: str) -> tuple[str | None, str, int]:
    """"train:12" -> (None, "train", 12); "web:train:12" (a mixture's dataset) -> ("web", "train", 12)."""
    parts = str(text).split(":")
    if len(parts) not in (2, 3) or not parts[-1].isdigit() or not parts[-2]:
        raise ConfigError(f"--document {text}: expected SPLIT:INDEX (e.g. train:12), or DATASET:SPLIT:INDEX in a "
                          "mixture; the index is the document's number in the cache's split")
    return (parts[0] if len(parts) == 3 else None), parts[-2], int(parts[-1])


def parse_origin(text: str) -> tuple[str, int] | None:
    """"data/a.jsonl:17" -> ("data/a.jsonl", 17): a document named by its origin (an input and its record: a
    JSON Lines line, a Parquet row); None for SPLIT:INDEX and DATASET:SPLIT:INDEX."""
    head, sep, tail = str(text).rpartition(":")
    if not sep or not tail.isdigit() or head.rpartition(":")[2] in SPLITS or not ("." in head or "/" in head):
        return None  # SPLIT:INDEX, DATASET:SPLIT:INDEX, rankR:INDEX: an input is named by its path (a.jsonl, data/x)
    return head, int(tail)


def _window_ids(ds, cache: str, split: str, doc: int) -> np.ndarray:
    """The window indices of an IndexedWindowDataset that hold any token of document `doc`."""
    docs = cache_documents(cache, split)
    d0, d1 = docs.span(doc)
    counts = np.diff(np.asarray(ds.cumulative))
    shard = np.repeat(np.arange(len(counts)), counts)
    local = np.arange(len(shard)) - np.asarray(ds.cumulative)[shard]
    start = np.asarray(docs.shard_starts)[shard] + local * ds.T
    return np.flatnonzero((start < d1) & (start + ds.T > d0))


def _targets(replay, dataset: str | None, split: str, doc: int):
    """What marks a sample as holding the document, for this replay's kind."""
    kind = replay.kind
    if kind == "parquet":
        rank = int(split[4:]) if split.startswith("rank") and split[4:].isdigit() else -1
        if not 0 <= rank < replay.world_size:
            raise ConfigError(f"--document {split}:{doc}: a run on Parquet text shards numbers each rank's documents; "
                              f"give rankR:INDEX with R from 0 to {replay.world_size - 1} (e.g. rank0:{doc})")
        return rank, doc
    if split != "train":
        raise ConfigError(f"--document {split}:{doc}: runs train on the train split; give a train:INDEX document")
    if kind in ("indexed", "shards"):
        return _window_ids(replay.dataset, replay.data, split, doc)
    if kind == "mixture":
        names = replay.dataset.names
        if dataset not in names:
            raise ConfigError(f"--document {dataset}:{split}:{doc}: the mixture's datasets are {', '.join(names)}; "
                              "give DATASET:SPLIT:INDEX with one of them")
        d = names.index(dataset)
        return d, set(_window_ids(replay.dataset.datasets[d], str(replay.opened[0].origins[d]), split, doc).tolist())
    if kind == "sft":
        cache_documents(replay.data, split).span(doc)  # raises on an index out of range
        return doc
    if kind == "packed":
        return np.array([_bin_of(replay, split, doc)])
    return cache_documents(replay.data, split).span(doc)


def _bin_of(replay, split: str, doc: int) -> int:
    """The packed bin holding sequence `doc` of the bins."""
    offsets = np.asarray(replay.dataset._open()["seq_offsets"])
    if not 0 <= doc < int(offsets[-1]):
        raise ConfigError(f"--document {split}:{doc}: the bins {replay.data} hold sequences {split}:0.."
                          f"{split}:{int(offsets[-1]) - 1}; give one of those")
    return int(np.searchsorted(offsets, doc, side="right")) - 1


def _holds(replay, target, sample) -> bool:
    kind = replay.kind
    if kind == "mixture":
        return sample[0] == target[0] and int(sample[1]) in target[1]
    if kind == "sft":
        return int(sample) == target
    shard, local = sample
    s = cache_documents(replay.data, "train").shard_starts[shard] + local
    return s < target[1] and s + replay.T > target[0]


def _global_hits(replay, start, first_step: int, last_step: int, accum: int, ids: np.ndarray) -> list[tuple]:
    """(step, rank, micro-batch, row, sample) of every sample in `ids` over steps first..last of a segment."""
    sched, n, world = replay.sampler.schedule, replay.sampler.num_samples, replay.world_size
    k0, k1 = (first_step - 1 - start[3]) * accum, (last_step - start[3]) * accum  # micro-batches [k0, k1)
    pos, k, hits = advance(sched, n, start[:3], k0), k0, []
    while k < k1:
        e, c, t = sched.position(n, *pos)
        g = sched.at(t)
        ramped = sched.steps[-1][0] > t
        count = 1 if ramped else min(k1 - k, (n - c) // g)  # batches of one size left in this epoch
        block = replay._order(e).slice(c, c + count * g).numpy()
        for p in np.flatnonzero(np.isin(block, ids)).tolist():
            kk, within = k + p // g, p % g
            per = g // world
            hits.append(((kk // accum) + start[3] + 1, within // per, kk % accum, within % per, int(block[p])))
        pos, k = advance(sched, n, (e, c, t), count), k + count
    return hits


def trace_document(run_dir, document: str, *, data: str | None = None) -> dict:
    """The steps of the run in `run_dir` whose sequences held `document` ("train:12", "web:train:12")."""
    by_origin = parse_origin(document)
    dataset, split, doc = (None, None, None) if by_origin is not None else parse_document(document)
    run = Run(run_dir, data=data)
    hits, origin = [], None  # (step, rank, micro-batch, row, sample)
    for first_step, last_step, ckpt, before in run.segments():
        replay = replay_of(run, ckpt)
        if split is None:  # INPUT:RECORD: the document of the run's cache that came from it
            if replay.kind in ("mixture", "parquet", "packed"):
                raise ConfigError(f"--document {document}: a run on {replay.kind} data names documents by "
                                  "SPLIT:INDEX (DATASET:SPLIT:INDEX in a mixture); INPUT:RECORD is looked up in a "
                                  "pretraining or SFT cache's origins")
            split, doc = find_document(replay.data, *by_origin)
        target = _targets(replay, dataset, split, doc)
        if origin is None:
            origin = _origin(replay, dataset, split, doc)
        base = 0 if before is None else before.step
        if replay.kind == "parquet":
            rank, doc_id = target
            count, skip = (last_step - base) * ckpt.accum, (first_step - 1 - base) * ckpt.accum
            hits += [(base + k // ckpt.accum + 1, rank, k % ckpt.accum, row, doc_id) for k, row in
                     parquet_hits(replay, None if before is None else before.states, count, rank, doc_id) if k >= skip]
            continue
        state = replay.start(None if before is None else before.states[0])
        if replay.kind in ("indexed", "shards", "packed"):
            hits += _global_hits(replay, (*state, base), first_step, last_step, ckpt.accum, np.asarray(target))
            continue
        for step in range(first_step, last_step + 1):
            for m in range(ckpt.accum):
                k = (step - 1 - base) * ckpt.accum + m
                for rank in range(ckpt.world_size):
                    for row, sample in enumerate(replay.samples(state, k, rank)):
                        if _holds(replay, target, sample):
                            hits.append((step, rank, m, row, list(sample) if isinstance(sample, tuple) else sample))
    hits.sort(key=lambda h: h[:4])
    steps = [dict(zip(("step", "rank", "micro_batch", "row", "sample"), h, strict=True)) for h in hits]
    return {"run": str(run.dir), "document": document, "origin": origin, "steps": steps}


def _origin(replay, dataset, split: str, doc: int) -> dict:
    if replay.kind == "packed":
        b = _bin_of(replay, split, doc)
        seq, a, z = next(t for t in packed_documents(replay.dataset, b) if t[0] == doc)
        return {"cache": replay.data, "split": split, "document": doc, "bin": b, "bin_tokens": [a, z]}
    if replay.kind == "parquet":
        return parquet_origin(replay.opened[int(split[4:])].source, doc)
    if replay.kind == "mixture":
        d = replay.dataset.names.index(dataset)
        return {"dataset": dataset, **cache_documents(str(replay.opened[0].origins[d]), split).origin(doc)}
    return cache_documents(replay.data, split).origin(doc)
