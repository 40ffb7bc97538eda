"""Fetching the shards of the next batches of a remote cache before the training step asks for them.

The plan is the sampler's own (its epoch order, or a stream's next draws). `RollingPlan` keeps it at least
PREFETCH_BATCHES batches long; `ShardPrefetcher` pins those shards (storage/local_cache.py) within
PREFETCH_SHARE of the download bound and downloads the missing ones in the background, nearest first. A
failed background download is dropped: the batch that needs the shard fetches it and raises the error.
"""

from __future__ import annotations

import contextlib
import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor

from niels_gpt.atomic import pid_alive
from niels_gpt.storage.local_cache import PINS, NoRoom, Pins

PREFETCH_BATCHES = 8  # how many batches ahead a sampler plans, at least
PREFETCH_NEW_SHARDS = 2  # and until its plan holds this many shards the current batch does not read
MAX_AHEAD_BATCHES = 100_000
PREFETCH_REQUESTS = 4  # parallel downloads
PREFETCH_SHARE = 0.75  # of the download cache's bound, at most, for one process's plan


class ShardPrefetcher:
    """Background downloads and pins of the shards a sampler's next batches need. Pickles as nothing
    running: a copy in another process starts its own threads and pin file when it plans."""

    def __init__(self, remote, *, requests: int = PREFETCH_REQUESTS):
        self.remote, self.requests = remote, max(1, int(requests))
        self.budget = int(_room(remote) * PREFETCH_SHARE)  # the host's: each planning process gets a share
        self.pins = Pins(remote.root)
        self.pinned: list[str] = []
        self.failures = 0  # background downloads that raised (the reader raises them again, by name)
        self._present: set[str] = set()  # pinned and seen mirrored: stays so while pinned
        self._pending: dict[str, Future] = {}
        self._pool, self._pid = None, None

    def __getstate__(self):
        return {"remote": self.remote, "requests": self.requests, "budget": self.budget, "pins": self.pins,
                "pinned": [], "failures": 0, "_present": set(), "_pending": {}, "_pool": None, "_pid": None}

    def plan(self, must, ahead) -> list[str]:
        """Pin and fetch the shards `must` (all) and `ahead` (nearest first, while they fit the budget), files
        relative to the cache. Returns the pinned files, nearest first."""
        order = list(dict.fromkeys(must))
        total = sum(self.remote.size(r) for r in order)
        budget = self.budget // planners(self.pins.root)
        seen = set(order)
        for r in ahead:
            if r in seen:
                continue
            size = self.remote.size(r)
            if total + size > budget:
                break
            order.append(r)
            seen.add(r)
            total += size
        base = f"{self.remote.local_dir}/"
        self.pins.set(base + r for r in order)
        self._present &= seen
        for r, f in self._pending.items():
            if r not in seen:
                f.cancel()  # queued for a plan that moved on: its room goes to the shards still planned
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


def local_world_size() -> int:
    """The ranks of this node ($LOCAL_WORLD_SIZE, as torchrun sets it), 1 when unset or not a number."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def planners(root) -> int:
    """Processes of this host planning downloads into the cache at `root`: this one, every other live process
    with a pin file there, and at least its node's ranks (started together, before their first pins)."""
    others = set()
    with contextlib.suppress(OSError):
        for name in os.listdir(os.path.join(root, PINS)):
            pid = name.split("-", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid() and pid_alive(int(pid)):
                others.add(pid)
    return max(1 + len(others), local_world_size())


def _room(remote) -> int:
    """The bound less the mirror's marker (never evicted, counted by the bound): what shards can fill."""
    try:
        marker = (remote.local_dir / remote.marker).stat().st_size
    except (AttributeError, OSError):
        marker = 0
    return max(0, remote.max_bytes - marker)


class RollingPlan:
    """The shard lists of a sampler's batches in flight and ahead, moved one batch per step; the prefetcher
    is told only when the planned shards change. Shard-window sampling changes shard every few hundred
    batches, so the plan reaches past PREFETCH_BATCHES until it holds PREFETCH_NEW_SHARDS new shards."""

    def __init__(self, prefetcher: ShardPrefetcher, *, in_flight: int):
        self.prefetcher = prefetcher
        self.in_flight: deque[list[str]] = deque(maxlen=max(0, in_flight))
        self.ahead: deque[tuple[object, list[str]]] = deque()
        self._count: dict[str, int] = {}  # shard -> batches of `ahead` reading it, in order of entry
        self._told: tuple | None = None

    def _push(self, pos, rels: list[str]) -> None:
        self.ahead.append((pos, rels))
        for r in rels:
            self._count[r] = self._count.get(r, 0) + 1

    def _pop(self) -> list[str]:
        rels = self.ahead.popleft()[1]
        for r in rels:
            self._count[r] -= 1
            if not self._count[r]:
                del self._count[r]
        return rels

    def step(self, position, upcoming, shards_of) -> None:
        """Batch `position` is about to be handed out; `upcoming` iterates the positions after it."""
        while self.ahead and self.ahead[0][0] != position:
            self._pop()  # a jump (a restored state, a new epoch): start the plan again
        if not self.ahead:
            self._push(position, shards_of(position))
        current = set(self.ahead[0][1])
        wanted = len(current) + PREFETCH_NEW_SHARDS
        if len(self.ahead) < PREFETCH_BATCHES or len(self._count) < wanted:
            for pos in upcoming(self.ahead[-1][0]):
                self._push(pos, shards_of(pos))
                enough = len(self.ahead) >= PREFETCH_BATCHES and len(self._count) >= wanted
                if enough or len(self.ahead) >= MAX_AHEAD_BATCHES:
                    break
        must = list(dict.fromkeys([r for b in self.in_flight for r in b] + self.ahead[0][1]))
        told = (frozenset(must), tuple(self._count))
        if told != self._told:
            self.prefetcher.plan(must, list(self._count))
            self._told = told
        self.in_flight.append(self._pop())
