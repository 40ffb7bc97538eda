"""One global order for a map-style dataset, cut into global batches, sliced by rank.

- epoch order from (seed, epoch) alone (loading/order.py); global batches are consecutive slices of G, the
  tail (N mod G) dropped; a batch schedule (loading/schedule.py) sets G from the samples delivered so far;
- rank r of W takes [r*G/W, (r+1)*G/W) of every global batch; workers fetch whole batches, in order;
- state {epoch, samples_consumed, samples_total, seed, fingerprint, order} counts global samples, so 8 ranks
  resume exactly on 2; a state whose order would change is refused unless allow_new_order=True;
- `ResumableDataLoader` reports the last batch *delivered*, not the last one its workers made.

Cost: one randperm per epoch (33 ms per million samples on 2 cores); figures in docs/loading.md.
"""

from __future__ import annotations

import contextlib
import numbers
import weakref

from torch.utils.data import DataLoader

from niels_gpt.errors import ConfigError, StateError
from niels_gpt.loading.ahead import assembled_ahead
from niels_gpt.loading.order import EpochOrder, TensorOrder, epoch_order
from niels_gpt.loading.prefetch import RollingPlan, ShardPrefetcher
from niels_gpt.loading.schedule import BatchSchedule
from niels_gpt.loading.windows import IndexedWindowDataset, collate_windows
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

SAMPLER_KIND = "global_batch_sampler"
STATE_FIELDS = ("epoch", "samples_consumed", "seed", "fingerprint")
IN_FLIGHT_BATCHES = 8  # batches handed out but maybe not read yet (ResumableDataLoader sets its own count)
ASSEMBLE_AHEAD = 1  # batches a ResumableDataLoader without workers assembles ahead, on a thread


class GlobalBatchSampler:
    """Batch sampler for `DataLoader(dataset, batch_sampler=...)` yielding this rank's index lists: iterating
    yields the rest of the current epoch, then moves on to the next one. `prefetch`: plan downloads for a
    remote dataset (None: whenever the dataset is remote).
    """

    kind = SAMPLER_KIND
    order_code = 1  # the order's code version: bumped whenever the same settings give another order

    def __init__(self, dataset, global_batch_size: int | None, *, seed: int, rank: int | None = None,
                 world_size: int | None = None, prefetch: bool | None = None, batch_schedule=None):
        self.rank, self.world_size = resolve_rank(rank, world_size)
        n = len(dataset)
        self.schedule = BatchSchedule.of(global_batch_size, batch_schedule, self.world_size, type(self).__name__)
        largest = max(g for _, g in self.schedule.steps)
        if n < largest:
            raise ConfigError(f"dataset has {n} samples, fewer than one global batch of {largest}; lower "
                              "global_batch_size or use more data")
        self.num_samples = n
        self.total = 0  # samples delivered in the run, across epochs (where a batch schedule stands)
        self.seed = check_seed(seed, f"{type(self).__name__}: seed")
        self.fingerprint = dataset_fingerprint(dataset)
        self.epoch = 0
        self.samples_consumed = 0
        self._perms: dict[tuple[int, int], EpochOrder | TensorOrder] = {}
        remote = getattr(dataset, "remote", None) if prefetch is not False else None
        self._dataset = dataset if remote is not None and hasattr(dataset, "shard_files") else None
        self.in_flight = IN_FLIGHT_BATCHES
        self._plan: RollingPlan | None = None
        self.plan_end: tuple[int, int] | None = None  # (epoch, consumed) after the run's last batch

    def end_after(self, batches: int) -> None:
        """The run takes `batches` more global batches: a remote cache's prefetch plan reaches no further
        (without it the plan fetches the next epoch's first shards). The batches are the same either way."""
        batches = batch_count(batches)
        if not self.schedule.constant:
            position = self.schedule.position(self.num_samples, self.epoch, self.samples_consumed, self.total)
            for _ in range(batches):
                position = self.schedule.after(self.num_samples, position)
            self.plan_end = position[:2]
            return
        epoch, consumed = self.next_position()
        per_epoch = self.usable // self.global_batch_size
        k = consumed // self.global_batch_size + batches
        self.plan_end = (epoch + k // per_epoch, k % per_epoch * self.global_batch_size)

    @property
    def global_batch_size(self) -> int:
        """The global batch of the next batch."""
        return self.schedule.at(self.total)

    @property
    def batch_size(self) -> int:
        return self.global_batch_size // self.world_size

    @property
    def usable(self) -> int:
        """Samples per epoch that land in a full global batch (of the current size)."""
        return self.num_samples // self.global_batch_size * self.global_batch_size

    def __len__(self) -> int:
        """Batches left in the current epoch (a fresh epoch: usable / G)."""
        epoch, consumed = self.next_position()
        return self.schedule.batches_left(self.num_samples, consumed, self.total)

    def permutation(self, epoch: int) -> EpochOrder | TensorOrder:
        """The global order of `epoch` (what a subclass changes)."""
        return epoch_order(self.num_samples, self.seed, epoch)

    def _order(self, epoch: int | None = None) -> EpochOrder | TensorOrder:
        key = (self.seed, self.epoch if epoch is None else epoch)
        if key not in self._perms:
            # the current epoch, and the next for a plan reaching past the end (a shard-window order is held)
            if len(self._perms) >= (2 if self._dataset is not None else 1):
                self._perms.pop(next(iter(self._perms)))
            self._perms[key] = self.permutation(key[1])
        return self._perms[key]

    def _batch_at(self, position: tuple[int, int, int]) -> list[str]:
        """The shards of this rank's share of the global batch at (epoch, samples consumed, samples total)."""
        epoch, consumed, total = position
        per = self.schedule.at(total) // self.world_size
        start = consumed + self.rank * per
        return self._dataset.shard_files(self._order(epoch).slice(start, start + per).numpy())

    def _after(self, position: tuple[int, int, int]):
        while True:
            position = self.schedule.after(self.num_samples, position)
            if self.plan_end is not None and position[:2] >= self.plan_end:
                return
            yield position

    def _prefetch(self, epoch: int, consumed: int) -> None:
        if self._dataset is None:
            return
        if self._plan is None:
            self._plan = RollingPlan(ShardPrefetcher(self._dataset.remote), in_flight=self.in_flight)
        self._plan.step((epoch, consumed, self.total), self._after, self._batch_at)

    @property
    def prefetcher(self) -> ShardPrefetcher | None:
        return None if self._plan is None else self._plan.prefetcher

    def next_position(self) -> tuple[int, int]:
        """(epoch, samples_consumed) where the next iteration starts (an exhausted epoch rolls over)."""
        return self.schedule.position(self.num_samples, self.epoch, self.samples_consumed, self.total)[:2]

    def __iter__(self):
        self.epoch, self.samples_consumed = self.next_position()
        while self.samples_consumed + self.global_batch_size <= self.num_samples:
            per = self.batch_size
            start = self.samples_consumed + self.rank * per
            self._prefetch(self.epoch, self.samples_consumed)
            # NOTE: advance before yielding: a state taken while this batch is in flight must not
            # hand it out again.
            self.total += per * self.world_size
            self.samples_consumed += per * self.world_size
            yield self._order().slice(start, start + per).tolist()
        self.epoch, self.samples_consumed = self.epoch + 1, 0

    def state_at(self, epoch: int, samples_consumed: int, total: int | None = None) -> dict:
        total = self.total if total is None else total
        state = {"kind": self.kind, "version": STATE_VERSION, "epoch": int(epoch),
                 "samples_consumed": int(samples_consumed), "seed": self.seed, "fingerprint": self.fingerprint,
                 "global_batch_size": self.schedule.at(total), **self.order_state(),
                 "order": self.order_at(epoch, samples_consumed, total)}
        if not self.schedule.constant:
            state["samples_total"] = int(total)
        return state

    def order_config(self) -> dict:
        """What the order depends on besides the position."""
        return {"code": f"{self.kind}/{self.order_code}", "seed": self.seed, "fingerprint": self.fingerprint,
                **self.schedule.record(), **self.order_state()}

    def order_at(self, epoch: int, consumed: int, total: int | None = None) -> dict:
        """The order record of a state at (epoch, consumed, total): order_config and the next sample ids."""
        epoch, consumed, total = self.schedule.position(self.num_samples, epoch, consumed,
                                                        self.total if total is None else total)
        order = self._perms.get((self.seed, epoch))
        order = self.permutation(epoch) if order is None else order
        ids = order.slice(consumed, consumed + min(ORDER_PEEK, self.schedule.at(total))).tolist()
        return order_record(ids, **self.order_config())

    def order_state(self) -> dict:
        """A subclass's settings of the order, saved with the state."""
        return {}

    def check_order_state(self, state: dict) -> None:
        """Refuse a state whose order_state differs (a subclass's)."""

    def state_dict(self) -> dict:
        return self.state_at(self.epoch, self.samples_consumed)

    def load_state_dict(self, state: dict, *, allow_new_order: bool = False) -> None:
        """Go on from `state`; allow_new_order=True: from its position even if the order changed (another seed,
        data, batch size or code), with this sampler's own settings."""
        saved = saved_order(self.kind, state)
        if not allow_new_order:
            check_state(state, kind=self.kind, fingerprint=self.fingerprint, fields=())
            self.check_order_state(state)
            check_order_config(self.kind, saved, self.order_config())
        state = check_state(state, kind=self.kind, fingerprint=None if allow_new_order else self.fingerprint,
                            fields=STATE_FIELDS)
        epoch = state_int(self.kind, state, "epoch")
        consumed = state_int(self.kind, state, "samples_consumed")
        if "samples_total" in state:
            total = state_int(self.kind, state, "samples_total")
        elif self.schedule.constant:  # a state of a run without a schedule: where a schedule would stand
            total = epoch * self.usable + consumed
        else:
            raise StateError(f"{self.kind} state: no samples_total, and this sampler has a batch schedule: resume "
                             "with the state of a scheduled run, or without batch_schedule")
        seed = state_int(self.kind, state, "seed", minimum=None)
        if consumed > self.num_samples:
            raise StateError(f"{self.kind} state: samples_consumed = {consumed}; expected 0..{self.num_samples} "
                             "(the dataset's samples): the state is hand-edited or corrupt")
        if not allow_new_order:
            # The state's seed wins (a state with an order record has this sampler's): the interrupted run's seed.
            self.seed = seed
            if saved is not None:
                check_order_digest(self.kind, saved, self.order_at(epoch, consumed, total))
        self.epoch, self.samples_consumed, self.total = epoch, consumed, total


def batch_count(batches) -> int:
    """end_after's `batches` as an int, or a ConfigError naming the value (a bool, a float or below 0)."""
    if isinstance(batches, bool) or not isinstance(batches, numbers.Integral) or batches < 0:
        raise ConfigError(f"end_after: {batches!r} batches ({type(batches).__name__}); expected 0 or more, an integer")
    return int(batches)


class ResumableDataLoader(DataLoader):
    """A plain torch DataLoader whose state is the last *delivered* batch, not the last one prefetched.

    The batch sampler is a `GlobalBatchSampler` or one with `state_dict`, `load_state_dict` and
    `advance_state(state) -> state` (after one more global batch), such as `MixtureSampler`; the loader
    keeps its own copy of the state, advanced once per delivered batch. Without workers, `assemble_ahead`
    batches are made on a background thread (0: in the loop's). A loop left with `break` and entered again
    gets the next batch it has not seen.
    """

    def __init__(self, dataset, batch_sampler, *, assemble_ahead: int = ASSEMBLE_AHEAD, **kwargs):
        if not (isinstance(batch_sampler, GlobalBatchSampler) or hasattr(batch_sampler, "advance_state")):
            raise ConfigError(f"ResumableDataLoader needs a GlobalBatchSampler or a MixtureSampler as "
                              f"batch_sampler, got {type(batch_sampler).__name__}")
        if isinstance(dataset, IndexedWindowDataset):  # its batches come gathered at once (__getitems__)
            kwargs.setdefault("collate_fn", collate_windows)
        super().__init__(dataset, batch_sampler=batch_sampler, **kwargs)
        if isinstance(batch_sampler, GlobalBatchSampler):  # batches the workers may hold, for the prefetch pins
            batch_sampler.in_flight = self.num_workers * (self.prefetch_factor or 0)
        self.assemble_ahead = int(assemble_ahead)
        self._position: tuple[int, int, int] | None = None
        self._delivered: dict | None = None
        self._active = None  # the iteration in progress, ended by the next one

    def __iter__(self):
        # NOTE: a loop left with `break` leaves its iteration suspended, its workers or thread holding batches
        # made but never delivered; a new iteration ends it and rewinds the sampler to the last delivered batch.
        self.close()
        sampler = self.batch_sampler
        it = self._iter_global(sampler) if isinstance(sampler, GlobalBatchSampler) else self._iter_stateful(sampler)
        # NOTE: a weak reference: a strong one would make loader and iteration a cycle, collected at some later
        # moment instead of when the loop drops it (workers then shut down in the middle of other work)
        self._active = weakref.ref(it)
        return it

    def close(self) -> None:
        """End the iteration in progress now: its workers or thread stop; the state stays the delivered one."""
        it = self._active() if self._active is not None else None
        self._active = None
        if it is not None:
            it.close()

    def _iter_global(self, sampler):
        if self._position is not None:
            sampler.epoch, sampler.samples_consumed, sampler.total = self._position
        epoch, consumed = sampler.next_position()
        total = sampler.total
        self._position = (epoch, consumed, total)
        with contextlib.closing(self._batches()) as batches:
            for batch in batches:
                g = sampler.schedule.at(total)
                consumed, total = consumed + g, total + g
                self._position = (epoch, consumed, total)
                yield batch
        self._position = (epoch + 1, 0, total)

    def _iter_stateful(self, sampler):
        if self._delivered is not None:
            # An earlier iteration was left with batches prefetched but never delivered: draw them again.
            sampler.load_state_dict(self._delivered)
        state = sampler.state_dict()
        self._delivered = state
        with contextlib.closing(self._batches()) as batches:
            for batch in batches:
                state = sampler.advance_state(state)
                self._delivered = state
                yield batch

    def _batches(self):
        """The DataLoader's batches; without workers and pinning, the same fetch and collate without the
        DataLoader's per-batch machinery (~0.15 ms of a 0.3 ms IndexedWindowDataset batch here)."""
        if self.num_workers or self.pin_memory:
            it = super().__iter__()
            try:
                yield from it
            finally:  # the workers stop now, not when the iterator is collected (persistent ones: at the next)
                shutdown = getattr(it, "_shutdown_workers", None)
                if shutdown is not None and not self.persistent_workers:
                    shutdown()
            return
        getitems = getattr(self.dataset, "__getitems__", None)

        def batches():
            for indices in self.batch_sampler:
                yield self.collate_fn(getitems(indices) if getitems else [self.dataset[i] for i in indices])

        yield from assembled_ahead(batches, self.assemble_ahead)

    def state_dict(self) -> dict:
        sampler = self.batch_sampler
        if self._position is not None:  # a GlobalBatchSampler's last delivered batch
            return sampler.state_at(*self._position)
        if self._delivered is None:  # nothing delivered since the sampler's state was set
            return sampler.state_dict()
        with_order = getattr(sampler, "state_with_order", None)
        return with_order(self._delivered) if with_order is not None else dict(self._delivered)

    def load_state_dict(self, state: dict, *, allow_new_order: bool = False) -> None:
        """Go on after the last delivered batch of `state`; allow_new_order: see GlobalBatchSampler.load_state_dict."""
        self.close()
        self.batch_sampler.load_state_dict(state, **({"allow_new_order": True} if allow_new_order else {}))
        self._position = None
        self._delivered = None
