"""The step log's elapsed time, time left at the pace so far, and passes over the data (`epoch 1.25`)."""

from __future__ import annotations

import time


def duration(seconds: float) -> str:
    """`45s`, `3m07s`, `2h05m`: whole seconds, minutes from one minute on, hours from one hour on."""
    s = max(int(round(seconds)), 0)
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class RunClock:
    """Started before the first step this process runs (`first`); the run ends after step `last`."""

    def __init__(self, first: int, last: int, clock=time.perf_counter):
        self.first, self.last, self.clock = first, last, clock
        self.t0 = clock()

    def fields(self, done: int, epoch: float | None = None) -> str:
        """` | elapsed .. | eta .. | epoch ..` after `done` steps (counted from the run's start)."""
        elapsed = self.clock() - self.t0
        ran = done - self.first
        eta = elapsed / ran * (self.last - done) if ran > 0 else 0.0
        return (f" | elapsed {duration(elapsed)} | eta {duration(eta)}"
                + ("" if epoch is None else f" | epoch {epoch:.2f}"))
