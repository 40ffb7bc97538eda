"""Global batch-size schedules: the global batch as a function of the samples delivered so far.

A schedule is a list of (start_sample, global_batch), the first start 0: `batch_ramp(128, 512, 1_000_000)`
ramps 128 -> 512 in 4 steps over the first million samples. The order of samples does not change, only
where the next batch is cut, from the position alone, so a run resumed mid-ramp on any world size delivers
the uninterrupted run's samples. An epoch ends when the next batch does not fit in what is left of it.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

from niels_gpt.errors import ConfigError
from niels_gpt.readers.checks import count


class BatchSchedule:
    """`schedule.at(total)`: the global batch after `total` samples delivered; each one a multiple of
    `world_size`, so that every rank takes an equal share."""

    def __init__(self, steps: int | Sequence[Sequence[int]] | BatchSchedule, *, world_size: int = 1):
        if isinstance(steps, BatchSchedule):
            steps = steps.steps
        if isinstance(steps, numbers.Integral) and not isinstance(steps, bool):
            steps = [(0, int(steps))]
        try:
            pairs = [(int(s), int(g)) for s, g in steps]
            ok = all(float(s) == a and float(g) == b for (s, g), (a, b) in zip(steps, pairs, strict=True))
        except (TypeError, ValueError):
            ok, pairs = False, []
        starts = [s for s, _ in pairs]
        if not ok or not pairs or starts[0] != 0 or starts != sorted(set(starts)) or min(g for _, g in pairs) < 1:
            raise ConfigError(f"batch schedule {steps!r}: expected (start_sample, global_batch) pairs of integers, the "
                              "first starting at 0, starts increasing, batches >= 1, e.g. [(0, 128), (100000, 256)]")
        self.steps = pairs
        for _, g in pairs:
            if g % world_size:
                raise ConfigError(f"global_batch_size {g} must be a positive multiple of world_size "
                                  f"{world_size} (every rank takes an equal share)")

    @classmethod
    def of(cls, global_batch_size: int | None, batch_schedule, world_size: int,
           where: str = "BatchSchedule") -> BatchSchedule:
        """A sampler's schedule (`where`: its name, for errors): `batch_schedule`, else the constant
        `global_batch_size`; given both, the size must be the schedule's last batch."""
        if batch_schedule is None:
            return cls(count(where, "global_batch_size", global_batch_size, what="a global batch size"),
                       world_size=world_size)
        schedule = cls(batch_schedule, world_size=world_size)
        if global_batch_size is not None and global_batch_size != schedule.steps[-1][1]:
            raise ConfigError(f"global_batch_size {global_batch_size} with a batch schedule ending at "
                              f"{schedule.steps[-1][1]}: pass None or the schedule's last batch")
        return schedule

    def at(self, total: int) -> int:
        """The global batch after `total` samples: the last step started by then (the first starts at 0)."""
        return next(g for start, g in reversed(self.steps) if start <= total)

    @property
    def constant(self) -> bool:
        return len(self.steps) == 1

    def record(self) -> dict:
        """How an order record names the batch: one size, or the whole schedule."""
        if self.constant:
            return {"global_batch_size": self.steps[0][1]}
        return {"batch_schedule": [list(p) for p in self.steps]}

    def total_at(self, step: int) -> int:
        """Samples delivered by the first `step` batches."""
        total = 0
        for k, (_, g) in enumerate(self.steps):
            if k + 1 < len(self.steps):
                n = min(step, max(0, -(-(self.steps[k + 1][0] - total) // g)))
            else:
                n = step
            total, step = total + n * g, step - n
        return total

    def position(self, n: int, epoch: int, consumed: int, total: int) -> tuple[int, int, int]:
        """Where the batch at (epoch, consumed, total) is cut: the next epoch's start if it does not fit."""
        if consumed + self.at(total) > n:
            return epoch + 1, 0, total
        return epoch, consumed, total

    def after(self, n: int, position: tuple[int, int, int]) -> tuple[int, int, int]:
        """The position after the batch at `position` (which fits)."""
        epoch, consumed, total = position
        g = self.at(total)
        return self.position(n, epoch, consumed + g, total + g)

    def batches_left(self, n: int, consumed: int, total: int) -> int:
        """Batches from (consumed, total) to the end of the epoch."""
        count = 0
        while self.steps[-1][0] > total:  # on the ramp: batch by batch
            g = self.at(total)
            if consumed + g > n:
                return count
            consumed, total, count = consumed + g, total + g, count + 1
        return count + max(n - consumed, 0) // self.steps[-1][1]


def batch_ramp(first: int, last: int, over_samples: int, *, steps: int = 4, multiple: int = 1) -> BatchSchedule:
    """A linear ramp of the global batch from `first` to `last` over the first `over_samples` samples, in `steps`
    equal stretches (each batch rounded down to a multiple of `multiple`, e.g. the world size), then `last`.

    Worked example: batch_ramp(128, 512, 1000, steps=4) -> [(0, 128), (250, 256), (500, 384), (750, 512)]."""
    if steps < 1 or over_samples < 0 or min(first, last, multiple) < 1:
        raise ConfigError(f"batch_ramp({first}, {last}, {over_samples}, steps={steps}, multiple={multiple}): "
                          "batches and multiple must be >= 1, steps >= 1, over_samples >= 0")
    pairs = []
    for k in range(steps):
        g = max(multiple, (first + (last - first) * k // (steps - 1 if steps > 1 else 1)) // multiple * multiple)
        start = over_samples * k // steps
        if not pairs or pairs[-1][1] != g:
            if pairs and pairs[-1][0] == start:
                pairs[-1] = (start, g)
            else:
                pairs.append((start, g))
    if pairs[-1][1] != last:
        pairs.append((over_samples, last))
    return BatchSchedule(pairs)
