"""A resumable per-rank stream of batches from a random-window dataset (anything with get_batch).

Batch `step` is a pure function of (seed, step): the global batch is drawn in draws of `draw_rows` rows,
draw k from its own generator seeded from (seed, step, k); rank r makes the draws that fill its rows. The
state is the step counter. With `draw_rows` dividing every per-rank batch (default: the per-rank batch) the
global batches are the same for every world size; a URL's shards are fetched ahead (loading/prefetch.py).
"""

from __future__ import annotations

import itertools
import math

import torch

from niels_gpt.errors import ConfigError, StateError
from niels_gpt.loading.order import mix_seed
from niels_gpt.loading.prefetch import RollingPlan, ShardPrefetcher
from niels_gpt.loading.sampler import batch_count
from niels_gpt.loading.schedule import BatchSchedule
from niels_gpt.readers.checks import count
from niels_gpt.resume import (
    ORDER_PEEK,
    STATE_VERSION,
    check_order_config,
    check_order_digest,
    check_state,
    dataset_fingerprint,
    order_record,
    resolve_rank,
    saved_order,
    state_int,
)
from niels_gpt.seeds import check_seed

STREAM_KIND = "rank_batch_stream"
STREAM_CODE = 1  # the stream's code version: bumped whenever the same settings give other draws


class RankBatchStream:
    """`next(stream) -> dataset.get_batch(B=..., generator=g)` output for this rank, forever."""

    def __init__(self, dataset, global_batch_size: int | None, *, seed: int, rank: int | None = None,
                 world_size: int | None = None, draw_rows: int | None = None, batch_schedule=None):
        self.rank, self.world_size = resolve_rank(rank, world_size)
        self.schedule = BatchSchedule.of(global_batch_size, batch_schedule, self.world_size, "RankBatchStream")
        self.dataset = dataset
        per = math.gcd(*(g // self.world_size for _, g in self.schedule.steps))
        self.draw_rows = per if draw_rows is None else count("RankBatchStream", "draw_rows", draw_rows, what="a row count")
        if per % self.draw_rows:
            raise ConfigError(f"draw_rows {self.draw_rows} must divide the per-rank batch {per}")
        self.seed = check_seed(seed, "RankBatchStream: seed")
        self.step = 0
        self.plan_end: int | None = None  # the step after the run's last one: nothing past it is fetched
        self.fingerprint = dataset_fingerprint(dataset)
        self._plan = None  # a dataset at a URL: its shards fetched ahead, step s's those its draws reach
        if getattr(dataset, "remote", None) is not None and hasattr(dataset, "draw_files"):
            # NOTE: no batch in flight: get_batch copies its windows out before the next step plans
            self._plan = RollingPlan(ShardPrefetcher(dataset.remote), in_flight=0)

    def __iter__(self):
        return self

    def end_after(self, batches: int) -> None:
        """The run takes `batches` more batches: a remote cache's prefetch plan reaches no further."""
        self.plan_end = self.step + batch_count(batches)

    def batch_at(self, step: int) -> int:
        """The global batch of `step`."""
        return self.schedule.at(self.schedule.total_at(step))

    @property
    def global_batch_size(self) -> int:
        return self.batch_at(self.step)

    @property
    def batch_size(self) -> int:
        return self.global_batch_size // self.world_size

    def draw_generators(self, step: int):
        """The generators of this rank's draws of `step`, in row order."""
        per = self.batch_at(step) // self.world_size
        first = self.rank * per // self.draw_rows
        for k in range(first, first + per // self.draw_rows):
            # NOTE: a CPU generator even for CUDA datasets: they draw window starts on the CPU.
            g = torch.Generator()
            # draw k of step s: worked example G=8, W=2, draw_rows=2 -> rank 1 makes draws 2 and 3,
            # the same draws rank 0 of a W=1 run makes for rows 4..7.
            g.manual_seed(mix_seed(self.seed, step, k, self.draw_rows))
            yield g

    def __next__(self):
        if self._plan is not None:
            self._plan.step(self.step, self._steps_after, self._draw_files)
        parts = [self.dataset.get_batch(B=self.draw_rows, generator=g) for g in self.draw_generators(self.step)]
        self.step += 1
        if len(parts) == 1:
            return parts[0]
        if isinstance(parts[0], (tuple, list)):
            return type(parts[0])(torch.cat(col) for col in zip(*parts, strict=True))
        return torch.cat(parts)

    def _steps_after(self, step: int):
        return itertools.count(step + 1) if self.plan_end is None else range(step + 1, self.plan_end)

    def _draw_files(self, step: int) -> list[str]:
        """The shard files of this rank's draws of `step`, replayed from its generators, in first-use order."""
        out: dict[str, None] = {}
        for g in self.draw_generators(step):
            out.update(dict.fromkeys(self.dataset.draw_files(self.draw_rows, g)))
        return list(out)

    def order_at(self, step: int) -> dict:
        """The order record of a state at `step`: the settings and the seeds of the step's first draws."""
        config = {"code": f"{STREAM_KIND}/{STREAM_CODE}", "seed": self.seed, "fingerprint": self.fingerprint,
                  **self.schedule.record(), "draw_rows": self.draw_rows}
        draws = min(ORDER_PEEK, self.batch_at(step) // self.draw_rows)
        return order_record([mix_seed(self.seed, step, k, self.draw_rows) for k in range(draws)], **config)

    def state_dict(self) -> dict:
        return {"kind": STREAM_KIND, "version": STATE_VERSION, "step": self.step, "seed": self.seed,
                "fingerprint": self.fingerprint, "draw_rows": self.draw_rows,
                "global_batch_size": self.global_batch_size, "order": self.order_at(self.step)}

    def load_state_dict(self, state: dict, *, allow_new_order: bool = False) -> None:
        """Go on from `state`; allow_new_order=True: from its step even if the stream changed (another seed,
        data, batch, draw_rows or code), with this stream's own settings."""
        saved = saved_order(STREAM_KIND, state)
        state = check_state(state, kind=STREAM_KIND, fingerprint=None if allow_new_order else self.fingerprint,
                            fields=("step", "seed", "draw_rows", "global_batch_size"))
        step = state_int(STREAM_KIND, state, "step")
        if allow_new_order:
            self.step = step
            return
        if (state["draw_rows"], state["global_batch_size"]) != (self.draw_rows, self.batch_at(step)):
            raise StateError(f"stream state: written with draw_rows={state['draw_rows']}, global batch "
                              f"{state['global_batch_size']}; this stream has {self.draw_rows}, "
                              f"{self.batch_at(step)}: construct the stream with the checkpoint's values, or "
                              "pass allow_new_order=True to go on from its step with these")
        check_order_config(STREAM_KIND, saved, self.order_at(step))  # the digest is compared after it
        seed = state_int(STREAM_KIND, state, "seed", minimum=None)
        if saved is not None:
            check_order_digest(STREAM_KIND, saved, self.order_at(step))
        self.seed, self.step = seed, step
