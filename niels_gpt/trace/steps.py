"""`trace_step`: the documents of every sequence of a step; `trace_state`: the same from a loader state.

Micro-batch m of step N is micro-batch (N - 1 - start) * accum + m from the replay's start.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, is_dataclass

from niels_gpt.errors import ConfigError
from niels_gpt.trace.parquet import parquet_sequences
from niels_gpt.trace.replay import Replay
from niels_gpt.trace.run import Checkpoint, Run
from niels_gpt.trace.sequences import sequence


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
    first = 0 if before is None else before.step
    accum = ckpt.accum
    micro = [(step - 1 - first) * accum + m for m in range(accum)]
    sequences = _sequences(replay, None if before is None else before.states, micro,
                           list(range(world)) if rank is None else [rank])
    return {"run": str(run.dir), "step": int(step), "kind": replay.kind, "data": replay.data, "world_size": world,
            "micro_batches": accum, "sequence_len": replay.T,
            "replayed_from": before.path.name if before is not None else "step 0", "sequences": sequences}
