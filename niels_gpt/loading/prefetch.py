"""Fetching the shards of the next batches of a remote cache before the training step asks for them.

    prefetch = ShardPrefetcher(remote)                 # in the process that draws the batches
    prefetch.plan(in_flight, ahead)                    # shard lists of batches handed out / coming next

- The plan is the sampler's own, nothing is guessed: `GlobalBatchSampler` and `ShardWindowSampler` read
  their epoch order, `RankBatchStream` replays the draws of its next steps (PREFETCH_BATCHES of them).
- `plan` pins (storage/local_cache.py) the shards of the batches in flight and of the batches ahead, as
  far ahead as PREFETCH_SHARE of the download cache's bound allows (the nearest batch always), so no
  process of the host (rank, DataLoader worker) evicts them before they are read; then it starts the
  downloads of those not mirrored yet on PREFETCH_REQUESTS background threads, nearest batch first.
- The downloads are the mirror's own (storage/mirror.py): checked, one per file per host (a reader that
  needs a shard being prefetched waits for that download instead of starting another), time-limited.
- A background download that fails is dropped: the batch that needs the shard fetches it itself and
  raises the error that names it. One that finds no room (everything else pinned) waits for the next plan.

Cost per batch: one shard lookup for the batch entering the plan and a set update; the pin file is
rewritten only when the pinned set changes.
"""

from __future__ import annotations

import itertools
import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor

from niels_gpt.storage.local_cache import NoRoom, Pins

PREFETCH_BATCHES = 64  # how many batches ahead a sampler plans
PREFETCH_REQUESTS = 4  # parallel downloads
PREFETCH_SHARE = 0.75  # of the download cache's bound, at most, for one process's plan


class ShardPrefetcher:
    """Background downloads and pins of the shards a sampler's next batches need. Pickles as nothing
    running: a copy in another process starts its own threads and pin file when it plans."""

    def __init__(self, remote, *, requests: int = PREFETCH_REQUESTS, share: float = PREFETCH_SHARE):
        self.remote, self.requests = remote, max(1, int(requests))
        self.budget = int(remote.max_bytes * share)
        self.pins = Pins(remote.root)
        self.pinned: list[str] = []
        self.failures = 0  # background downloads that raised (the reader raises them again, by name)
        self._present: set[str] = set()  # pinned and seen mirrored: stays so while pinned
        self._pending: dict[str, Future] = {}
        self._pool, self._pid = None, None

    def __getstate__(self):
        return {"remote": self.remote, "requests": self.requests, "budget": self.budget, "pins": self.pins,
                "pinned": [], "failures": 0, "_present": set(), "_pending": {}, "_pool": None, "_pid": None}

    def plan(self, in_flight, ahead) -> list[str]:
        """Pin and fetch the shards of `in_flight` batches (all) and of `ahead` batches (within budget);
        each batch is a list of files relative to the cache. Returns the pinned files, nearest first."""
        order: list[str] = []
        seen: set[str] = set()
        total = 0
        for i, batch in enumerate([*in_flight, *ahead]):
            add = [r for r in batch if r not in seen]
            size = sum(self.remote.size(r) for r in add)
            if i > len(in_flight) and total + size > self.budget:
                break
            order += add
            seen.update(add)
            total += size
        self.pins.set(str(self.remote.local_dir / r) for r in order)
        self._present &= seen
        self._pending = {r: f for r, f in self._pending.items() if not f.done()}
        for r in order:
            if r in self._present or r in self._pending:
                continue
            if self.remote.has(r):
                self._present.add(r)
            else:
                self._pending[r] = self._executor().submit(self._fetch, r)
        self.pinned = order
        return order

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None or self._pid != os.getpid():
            self._pool = ThreadPoolExecutor(self.requests, thread_name_prefix="niels-gpt-prefetch")
            self._pid = os.getpid()
        return self._pool

    def _fetch(self, rel: str) -> None:
        try:
            self.remote.fetch(rel, prefetch=True)
        except NoRoom:
            pass
        except Exception:  # noqa: BLE001 - the reader that needs the shard raises it, naming the file
            self.failures += 1

    def wait(self) -> None:
        """Block until the downloads started so far have ended (tests, benches)."""
        for f in list(self._pending.values()):
            f.result()

    def close(self) -> None:
        """Stop planning: drop the pins and let queued downloads go (one in progress finishes)."""
        if self._pool is not None and self._pid == os.getpid():
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = None
        self.pins.close()
        self._present.clear()


class RollingPlan:
    """The shard lists of a sampler's batches in flight and ahead, moved one batch per step.

    `shards_of(position)` gives a batch's shards; positions are whatever the sampler counts (steps,
    samples consumed); `next_positions` yields the positions after the last one planned."""

    def __init__(self, prefetcher: ShardPrefetcher, *, in_flight: int, ahead: int = PREFETCH_BATCHES):
        self.prefetcher, self.in_flight_n, self.ahead_n = prefetcher, max(0, in_flight), max(1, ahead)
        self.in_flight: deque[list[str]] = deque(maxlen=self.in_flight_n)
        self.ahead: deque[tuple[object, list[str]]] = deque()

    def step(self, position, upcoming, shards_of) -> None:
        """Batch `position` is about to be handed out; `upcoming` iterates the positions after it."""
        while self.ahead and self.ahead[0][0] != position:
            self.ahead.popleft()  # a jump (a restored state, a new epoch): start the plan again
        if not self.ahead:
            self.ahead.append((position, shards_of(position)))
        last = self.ahead[-1][0]
        if len(self.ahead) < self.ahead_n:
            for pos in upcoming(last):
                self.ahead.append((pos, shards_of(pos)))
                if len(self.ahead) >= self.ahead_n:
                    break
        self.prefetcher.plan(list(self.in_flight), [rels for _, rels in self.ahead])
        self.in_flight.append(self.ahead.popleft()[1])


class DrawPlan:
    """The plan of a RankBatchStream over a random-window dataset at a URL: step s's shards are those its
    draws reach, replayed from the step's own generators (`dataset.draw_files(B, generator)`)."""

    def __init__(self, stream):
        self.stream = stream
        # NOTE: no batch in flight: get_batch copies its windows out before the next step plans
        self.rolling = RollingPlan(ShardPrefetcher(stream.dataset.remote), in_flight=0)

    @staticmethod
    def wanted(stream) -> bool:
        return getattr(stream.dataset, "remote", None) is not None and hasattr(stream.dataset, "draw_files")

    def step(self, step: int) -> None:
        self.rolling.step(step, lambda s: itertools.count(s + 1), self._files)

    def _files(self, step: int) -> list[str]:
        s = self.stream
        out: dict[str, None] = {}
        for g in s.draw_generators(step):
            out.update(dict.fromkeys(s.dataset.draw_files(s.draw_rows, g)))
        return list(out)
