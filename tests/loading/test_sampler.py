"""Global sampler: one batch stream for every world size and worker count; exact resumption."""

import json

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from niels_gpt.errors import ConfigError, StateError
from niels_gpt.loading.order import epoch_permutation, global_batches
from niels_gpt.loading.sampler import GlobalBatchSampler, ResumableDataLoader
from niels_gpt.loading.stream import RankBatchStream
from niels_gpt.resume import fingerprint


class Indices(Dataset):
    """ds[i] = i: what a batch holds is the sample ids themselves."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor(i)

    def fingerprint(self):
        return fingerprint("indices", self.n)


def delivered(batches_per_worker: list[list], n_batches: int) -> list:
    """How a DataLoader hands out batches fetched round-robin by its workers: in sampler order."""
    nw = len(batches_per_worker)
    return [batches_per_worker[t % nw][t // nw] for t in range(n_batches)]


@pytest.mark.parametrize("N,G", [(100, 8), (1000, 24), (5000, 120), (5000, 840), (841, 840)])
def test_every_world_size_and_worker_count_sees_the_same_global_batches(N, G):
    expected = global_batches(N, G, seed=3, epoch=0)
    perm = epoch_permutation(N, 3, 0)
    assert len(expected) == N // G
    # every sample of the epoch exactly once, except the N mod G dropped tail
    flat = [i for b in expected for i in b]
    assert sorted(flat) == sorted(perm[:N // G * G].tolist()) and len(set(flat)) == len(flat)
    for W in range(1, 9):
        if G % W:
            continue
        per_rank = []
        for r in range(W):
            sampler = GlobalBatchSampler(range(N), G, seed=3, rank=r, world_size=W)
            mine = list(sampler)
            assert mine == [b[r * G // W:(r + 1) * G // W] for b in expected]
            per_rank.append(mine)
        for nw in range(0, 5):
            ranks_seen = []
            for r in range(W):
                workers = [per_rank[r][w::max(nw, 1)] for w in range(max(nw, 1))]
                ranks_seen.append(delivered(workers, len(expected)))
            rebuilt = [sum((ranks_seen[r][t] for r in range(W)), []) for t in range(len(expected))]
            assert rebuilt == expected, (W, nw)


def test_real_dataloader_batches_do_not_depend_on_num_workers():
    runs = []
    for nw in (0, 1, 2):
        sampler = GlobalBatchSampler(Indices(203), 20, seed=7, rank=1, world_size=2)
        runs.append([b.tolist() for b in DataLoader(Indices(203), batch_sampler=sampler, num_workers=nw)])
    assert runs[0] == runs[1] == runs[2]
    assert runs[0] == [b[10:20] for b in global_batches(203, 20, seed=7, epoch=0)]


def test_epochs_roll_over_with_a_fresh_permutation():
    sampler = GlobalBatchSampler(range(30), 10, seed=0, rank=0, world_size=1)
    e0, e1 = list(sampler), list(sampler)
    assert sorted(sum(e0, [])) == sorted(sum(e1, [])) == list(range(30))
    assert e0 != e1 and sampler.state_dict()["epoch"] == 2


def run_all(loader, steps):
    out = []
    for b in loader:
        out.append(b.tolist())
        if len(out) == steps:
            break
    return out


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_at_a_random_step_continues_exactly(num_workers):
    ds = Indices(500)
    full = run_all(ResumableDataLoader(ds, GlobalBatchSampler(ds, 16, seed=5, rank=0, world_size=2)), 10**9)
    stop = int(torch.randint(1, len(full) - 1, (1,), generator=torch.Generator().manual_seed(num_workers)))
    first = ResumableDataLoader(ds, GlobalBatchSampler(ds, 16, seed=5, rank=0, world_size=2),
                                num_workers=num_workers, prefetch_factor=4 if num_workers else None)
    head = run_all(first, stop)
    state = json.loads(json.dumps(first.state_dict()))  # what a checkpoint stores
    assert state["samples_consumed"] == stop * 16 and state["epoch"] == 0
    second = ResumableDataLoader(ds, GlobalBatchSampler(ds, 16, seed=5, rank=0, world_size=2),
                                 num_workers=num_workers)
    second.load_state_dict(state)
    assert head + run_all(second, 10**9) == full


def assembled(N, G, W, seed, state=None, steps=None):
    """Global batches of a W-rank run (ranks concatenated), optionally from a state; + rank 0's state."""
    samplers = [GlobalBatchSampler(range(N), G, seed=seed, rank=r, world_size=W) for r in range(W)]
    if state is not None:
        for s in samplers:
            s.load_state_dict(state)
    iters = [iter(s) for s in samplers]
    out = []
    for parts in zip(*iters, strict=True):
        out.append(sum(parts, []))
        if steps is not None and len(out) == steps:
            break
    return out, samplers[0].state_dict()


@pytest.mark.parametrize("W_before,W_after", [(4, 2), (2, 8), (8, 1)])
def test_resume_after_world_size_change_continues_exactly(W_before, W_after):
    full, _ = assembled(1000, 40, 1, seed=11)
    head, state = assembled(1000, 40, W_before, seed=11, steps=9)
    tail, _ = assembled(1000, 40, W_after, seed=11, state=json.loads(json.dumps(state)))
    assert head + tail == full


def test_resume_at_the_end_of_an_epoch_starts_the_next():
    ds = Indices(40)
    loader = ResumableDataLoader(ds, GlobalBatchSampler(ds, 10, seed=1, rank=0, world_size=1))
    assert len(run_all(loader, 4)) == 4
    other = ResumableDataLoader(ds, GlobalBatchSampler(ds, 10, seed=1, rank=0, world_size=1))
    other.load_state_dict(loader.state_dict())
    expected = global_batches(40, 10, seed=1, epoch=1)
    assert run_all(other, 10**9) == expected


def test_state_of_another_dataset_is_rejected():
    state = GlobalBatchSampler(range(100), 10, seed=0, rank=0, world_size=1).state_dict()
    other = GlobalBatchSampler(range(101), 10, seed=0, rank=0, world_size=1)
    with pytest.raises(StateError, match="fingerprint .* does not match"):
        other.load_state_dict(state)


@pytest.mark.parametrize("edit,match", [
    ({"kind": "mixture_sampler"}, "written by 'mixture_sampler'"),
    ({"version": 99}, "version 99"),
    ({"samples_consumed": None}, "missing field"),
])
def test_malformed_states_are_rejected(edit, match):
    sampler = GlobalBatchSampler(range(100), 10, seed=0, rank=0, world_size=1)
    state = {**sampler.state_dict(), **edit}
    state = {k: v for k, v in state.items() if v is not None}
    with pytest.raises(StateError, match=match):
        sampler.load_state_dict(state)


def test_non_dict_state_is_rejected():
    with pytest.raises(StateError, match="expected a dict"):
        GlobalBatchSampler(range(100), 10, seed=0, rank=0, world_size=1).load_state_dict([1, 2])


def test_global_batch_must_divide_by_world_size():
    with pytest.raises(ConfigError, match="multiple of world_size 3"):
        GlobalBatchSampler(range(100), 10, seed=0, rank=0, world_size=3)


def test_dataset_smaller_than_a_global_batch_is_rejected():
    with pytest.raises(ConfigError, match="fewer than one global batch"):
        GlobalBatchSampler(range(5), 10, seed=0, rank=0, world_size=1)


def test_rank_outside_world_is_rejected():
    with pytest.raises(ConfigError, match="0 <= rank < world_size"):
        GlobalBatchSampler(range(100), 10, seed=0, rank=2, world_size=2)


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")
def test_stateful_dataloader_resumes_exactly():
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    ds = Indices(300)

    def make():
        return sdl.StatefulDataLoader(ds, batch_sampler=GlobalBatchSampler(ds, 12, seed=2, rank=1, world_size=3),
                                      num_workers=2)

    full = run_all(make(), 10**9)
    first = make()
    head = run_all(first, 7)
    state = first.state_dict()
    second = make()
    second.load_state_dict(state)
    assert head + run_all(second, 10**9) == full


def _packed(path, first_token):
    from niels_gpt.packing.memmap_format import MemmapShardWriter

    with MemmapShardWriter(path, 20, 8, 20) as w:
        for b in range(20):
            w.write_bin(np.arange(first_token + b, first_token + b + 8, dtype=np.int32), np.ones(8, np.uint8) * 0, [0])
        w.finalize()
    return path


def test_a_sampler_state_of_other_packed_bins_with_as_many_bins_is_refused(tmp_path):
    from niels_gpt.packing import open_packed

    a, b = open_packed(_packed(tmp_path / "a", 0)), open_packed(_packed(tmp_path / "b", 100))
    assert len(a) == len(b)
    state = GlobalBatchSampler(a, 4, seed=0, rank=0, world_size=1).state_dict()
    with pytest.raises(StateError, match="does not match"):
        GlobalBatchSampler(b, 4, seed=0, rank=0, world_size=1).load_state_dict(state)
    moved = open_packed(_packed(tmp_path / "moved" / "a", 0))  # the same bins elsewhere still resume
    GlobalBatchSampler(moved, 4, seed=0, rank=0, world_size=1).load_state_dict(state)
    many = open_packed([tmp_path / "a", tmp_path / "b"])
    other = open_packed([tmp_path / "b", tmp_path / "a"])
    assert many.fingerprint() != other.fingerprint()


class Nameless(Dataset):
    def __len__(self):
        return 100

    def __getitem__(self, i):
        return i


def test_a_dataset_that_does_not_name_its_content_is_refused():
    with pytest.raises(ConfigError, match="Nameless does not name its content"):
        GlobalBatchSampler(Nameless(), 10, seed=0, rank=0, world_size=1)
    with pytest.raises(ConfigError, match="does not name its content"):
        RankBatchStream(Nameless(), 10, seed=0, rank=0, world_size=1)
