"""`trace_step`: the documents of every sequence of a step; `trace_state`: the same from a loader state.

A run as trace reads it (`Run`): its checkpoints' settings and loader states, by step. Step N (1 = the
first) was made by the segment that wrote the first checkpoint at or after N; the replay starts at the
checkpoint before it, or at step 0. Checkpoints are opened with mmap: weights are not read. Micro-batch m
of step N is micro-batch (N - 1 - start) * accum + m from the replay's start.

A traced sample as the model saw it (`sequence`): {sample, input_ids[T], trained[T], documents}.
`trained[j]`: the target after position j entered the loss. A window of split tokens [s, s+T] holds a
document [d0, d1) at [max(d0, s) - s, min(d1, s+T) - s) of the sequence.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path

import numpy as np

from niels_gpt.constants import IGNORE_INDEX
from niels_gpt.errors import ConfigError
from niels_gpt.packing import collate_packed
from niels_gpt.trace.documents import cache_documents, document_origin, packed_origin
from niels_gpt.trace.replay import Replay, parquet_sequences
from niels_gpt.train.checkpoint import CKPT_PATTERN, RUN_NAME, checkpoints, read_run
from niels_gpt.urls import is_url


@dataclass(frozen=True)
class Checkpoint:
    step: int
    path: Path
    config: dict  # the train_config the segment that wrote it ran with
    states: list  # one loader state per rank ({"kind", "loader"})
    vocab_size: int | None

    @property
    def world_size(self) -> int:
        return len(self.states)

    @property
    def accum(self) -> int:
        """Micro-batches per rank per step."""
        if self.config.get("batch_ramp"):
            return 1
        tokens = int(self.config["device_batch_size"]) * int(self.config["sequence_len"]) * self.world_size
        return int(self.config.get("total_batch_size") or tokens) // tokens


@functools.lru_cache(maxsize=64)
def _load(path: str, mtime: float) -> Checkpoint:
    import torch

    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        step, config, states = int(ckpt["step"]), dict(ckpt["train_config"]), list(ckpt["loader"])
    except Exception as exc:  # noqa: BLE001 - a damaged zip or pickle raises many kinds; each is this one condition
        raise ConfigError(f"{path}: not a readable checkpoint of this trainer ({type(exc).__name__}); "
                          "trace reads the run's checkpoints: move the damaged file out of the run directory") from None
    return Checkpoint(step, Path(path), config, states, (ckpt.get("model_config") or {}).get("vocab_size"))


class Run:
    """`Run(dir)`: the run's checkpoints; `segment(step)` -> (the checkpoint whose segment made the step,
    the checkpoint the replay starts from or None for step 0)."""

    def __init__(self, run_dir, *, data: str | None = None):
        self.dir = Path(run_dir)
        if not self.dir.is_dir():
            what = "a file" if self.dir.exists() else "no such directory"
            raise ConfigError(f"{self.dir}: {what}; give a run directory (the --out-dir of `train`, holding "
                              f"{RUN_NAME} and ckpt_<step>.pt files)")
        self.paths = checkpoints(self.dir)
        if read_run(self.dir) is None or not self.paths:
            raise ConfigError(f"{self.dir}: not a training run ({'no ' + RUN_NAME if read_run(self.dir) is None else 'no checkpoint'}); "
                              "give the --out-dir of a `train` run that saved a checkpoint")
        self.steps = [int(CKPT_PATTERN.match(p.name).group(1)) for p in self.paths]
        self.data_override = data

    def checkpoint(self, i: int) -> Checkpoint:
        p = self.paths[i]
        return _load(str(p), p.stat().st_mtime)

    def segment(self, step: int) -> tuple[Checkpoint, Checkpoint | None]:
        last = self.steps[-1]
        if not 1 <= step <= last:
            raise ConfigError(f"--step {step}: beyond the run {self.dir}, whose checkpoints reach step {last} "
                              f"({self.paths[-1].name}); give a step from 1 to {last}")
        after = next(i for i, s in enumerate(self.steps) if s >= step)
        return self.checkpoint(after), (self.checkpoint(after - 1) if after else None)

    def segments(self) -> list[tuple[int, int, Checkpoint, Checkpoint | None]]:
        """[(first step, last step, checkpoint that made them, start checkpoint or None)] covering the run."""
        out, prev = [], 0
        for i, s in enumerate(self.steps):
            if s > prev:
                out.append((prev + 1, s, self.checkpoint(i), self.checkpoint(i - 1) if i else None))
            prev = s
        return out

    def data(self, config: dict) -> str:
        """The run's data as a path that exists from here (as recorded, else beside the run), or its URL."""
        recorded = self.data_override or str(config["data"])
        if is_url(recorded) or Path(recorded).exists() or self.data_override:
            return recorded
        return next((str(b / recorded) for b in self.dir.resolve().parents if (b / recorded).exists()), recorded)


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


@functools.lru_cache(maxsize=8)
def _cached(data: str, config_items: tuple, world_size: int, vocab_size) -> Replay:
    return Replay(data, dict(config_items), world_size, vocab_size)


def _replay(data: str, config: dict, world_size: int, vocab_size) -> Replay:
    flat = {k: v for k, v in config.items() if not isinstance(v, (dict, list))}
    return _cached(data, tuple(sorted(flat.items())), world_size, vocab_size)


def replay_of(run: Run, ckpt: Checkpoint) -> Replay:
    """The replay of the segment that wrote `ckpt`, its data's fingerprint checked against the run's."""
    data = run.data(ckpt.config)
    try:
        replay = _replay(data, ckpt.config, ckpt.world_size, ckpt.vocab_size)
    except ConfigError as exc:
        raise ConfigError(f"{run.dir}: its data {data} cannot be opened as the run read it ({exc}); pass --data "
                          "with where the run's data is now") from None
    saved, now = (ckpt.states[0].get("loader") or {}).get("fingerprint"), replay.sampler.fingerprint
    if saved is not None and saved != now:
        raise ConfigError(f"{data}: not the data the run {run.dir} trained on (its fingerprint {now} "
                          f"is not {saved}, recorded in {ckpt.path.name}): the cache was rebuilt or changed since; "
                          "trace the run on the data it read (--data PATH to where it is now)")
    saved = (ckpt.states[0].get("loader") or {}).get("order")
    now = replay.order_at(ckpt.states[0]) if isinstance(saved, dict) else None  # none: an older checkpoint
    if now is not None and saved.get("digest") != now["digest"]:
        differs = "; ".join(f"{k} {saved.get(k)!r} -> {v!r}" for k, v in now.items() if k != "digest" and saved.get(k) != v)
        raise ConfigError(f"{run.dir}: {ckpt.path.name} records the data order of its run, and its settings replayed "
                          f"here give another ({differs or 'the same settings'}; the next samples' digest "
                          f"{str(saved.get('digest'))[:12]}... -> {now['digest'][:12]}...): the order's code changed "
                          "since the run, or its loader state was edited, and trace would name documents the run did "
                          "not read; trace the run with the niels_gpt release that trained it")
    return replay


def _sequences(replay: Replay, states, micro_batches: list[int], ranks: list[int]) -> list[dict]:
    """`states`: the loader state of every rank (a checkpoint's list, or {rank: state}), or None: the start."""
    if replay.kind == "parquet":
        return parquet_sequences(replay, states, micro_batches, ranks)
    start = replay.start(None if states is None else states[0] if isinstance(states, list) else
                         next(iter(states.values())))
    out = []
    for rank in ranks:
        for m, k in enumerate(micro_batches):
            for row, sample in enumerate(replay.samples(start, k, rank)):
                out.append({"rank": rank, "micro_batch": m, "row": row, **sequence(replay, sample)})
    return out


def trace_state(state: dict | None, config, *, world_size: int = 1, micro_batches=(0,), ranks=None,
                data: str | None = None) -> list[dict]:
    """The sequences a loader delivers after `state` (TrainData's or its sampler's; None: the start), with
    their documents, without running it; `config`: the run's TrainConfig or its dict."""
    cfg = asdict(config) if is_dataclass(config) else dict(config)
    if state is not None and "loader" not in state:
        state = {"kind": None, "loader": state}
    replay = _replay(str(data or cfg["data"]), cfg, world_size, cfg.get("vocab_size"))
    ranks = list(range(world_size)) if ranks is None else list(ranks)
    return _sequences(replay, None if state is None else {r: state for r in ranks}, list(micro_batches), ranks)


def trace_step(run_dir, step: int, *, rank: int | None = None, data: str | None = None) -> dict:
    """Every sequence of step `step` of the run in `run_dir` (on every rank, or `rank`), with its documents:
    their origin (documents.document_origin), token range in the sequence, trained tokens."""
    run = Run(run_dir, data=data)
    ckpt, before = run.segment(int(step))
    world = ckpt.world_size
    if rank is not None and not 0 <= rank < world:
        raise ConfigError(f"--rank {rank}: step {step} of {run.dir} ran on {world} rank(s) (as {ckpt.path.name} "
                          f"records); give a rank from 0 to {world - 1}")
    replay = replay_of(run, ckpt)
    if before is not None and "order" in (before.states[0].get("loader") or {}):
        replay_of(run, before)  # the replay starts at its state: checked against the order of its own segment
    first = 0 if before is None else before.step
    accum = ckpt.accum
    micro = [(step - 1 - first) * accum + m for m in range(accum)]
    sequences = _sequences(replay, None if before is None else before.states, micro,
                           list(range(world)) if rank is None else [rank])
    return {"run": str(run.dir), "step": int(step), "kind": replay.kind, "data": replay.data, "world_size": world,
            "micro_batches": accum, "sequence_len": replay.T,
            "replayed_from": before.path.name if before is not None else "step 0", "sequences": sequences}
