"""Elastic schedules: a global batch that ramps (cut from the same order, resumable mid-ramp on any world
size) and mixture weights that change (each dataset goes on from the draw where it stopped)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import Dataset

from niels_gpt.errors import ConfigError, StateError
from niels_gpt.loading import MixtureDataset, MixtureSampler, Phase, ResumableDataLoader
from niels_gpt.loading.order import epoch_permutation
from niels_gpt.loading.sampler import GlobalBatchSampler
from niels_gpt.loading.schedule import BatchSchedule, batch_ramp
from niels_gpt.loading.shard_windows import ShardWindowSampler
from niels_gpt.resume import fingerprint

RAMP = [(0, 4), (12, 8), (40, 16)]  # 3 batches of 4, then batches of 8 from sample 12, 16 from sample 40


class Ids(Dataset):
    def __init__(self, n=100, tag="a"):
        self.n, self.tag = n, tag

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i

    def fingerprint(self):
        return fingerprint("ids", self.n, self.tag)

    def shard_counts(self):
        return [25] * 4


def endless(loader):
    """Epoch after epoch (a sampler's or loader's iteration ends with its epoch)."""
    while True:
        yield from loader


def run(make, world, batches, state=None):
    """The global batches `batches` steps of every rank of `world` deliver (rank slices joined), and the state."""
    out, states = [[] for _ in range(batches)], []
    for rank in range(world):
        loader = make(rank, world)
        if state is not None:
            loader.load_state_dict(state)
        it = endless(loader)
        for k in range(batches):
            out[k] += [int(i) for i in next(it)]
        states.append(loader.state_dict())
    assert all(s == states[0] for s in states)
    return out, states[0]


def sampler(rank, world, cls=GlobalBatchSampler):
    return cls(Ids(), None, seed=3, rank=rank, world_size=world, batch_schedule=RAMP)


def loader(rank, world):
    ds = Ids()
    return ResumableDataLoader(ds, sampler(rank, world), collate_fn=lambda b: b)


def shard_sampler(rank, world):
    return sampler(rank, world, ShardWindowSampler)


@pytest.mark.parametrize("make", [sampler, loader, shard_sampler])
def test_a_run_interrupted_mid_ramp_delivers_the_uninterrupted_runs_samples_on_any_world_size(make):
    whole, _ = run(make, 1, 14)  # the ramp, the epoch's end (92 samples of 100: 3 x 4, 4 x 8, 3 x 16) and on
    assert [len(b) for b in whole] == [4, 4, 4, 8, 8, 8, 8] + [16] * 7
    first, state = run(make, 1, 4)  # stops inside the ramp
    assert state["samples_total"] == 20
    rest, _ = run(make, 4, 10, state)  # goes on with 4 ranks
    assert first + rest == whole
    # the batches are cut from the epoch order: every sample of an epoch once, none repeated or skipped
    epoch0 = [i for b in whole[:10] for i in b]
    assert len(epoch0) == len(set(epoch0)) == 92
    if make is not shard_sampler:
        assert epoch0 == epoch_permutation(100, 3, 0)[:92].tolist()


def test_a_schedule_is_checked_and_the_ramp_helper_names_its_steps():
    assert batch_ramp(128, 512, 1000, steps=4).steps == [(0, 128), (250, 256), (500, 384), (750, 512)]
    assert BatchSchedule(RAMP).at(11) == 4 and BatchSchedule(RAMP).at(12) == 8 and BatchSchedule(RAMP).at(10**9) == 16
    for bad in ([(1, 4)], [(0, 4), (0, 8)], [(0, 0)], [(0, 2.5)], "x", []):
        with pytest.raises(ConfigError, match="batch schedule"):
            BatchSchedule(bad)
    with pytest.raises(ConfigError, match="multiple of world_size 3"):
        GlobalBatchSampler(Ids(), None, seed=0, rank=0, world_size=3, batch_schedule=[(0, 6), (10, 8)])
    with pytest.raises(ConfigError, match="the schedule's last batch"):
        GlobalBatchSampler(Ids(), 4, seed=0, rank=0, world_size=1, batch_schedule=RAMP)


def test_a_state_of_another_schedule_is_refused_unless_allowed():
    s = sampler(0, 1)
    it = iter(s)
    next(it)
    state = s.state_dict()
    other = GlobalBatchSampler(Ids(), None, seed=3, rank=0, world_size=1, batch_schedule=[(0, 4), (24, 8)])
    with pytest.raises(StateError, match="batch_schedule"):
        other.load_state_dict(state)
    other.load_state_dict(state, allow_new_order=True)
    assert next(iter(other)) == next(it)  # the same position, the same order


def mixture(phases):
    mix = MixtureDataset({"a": Ids(50, "a"), "b": Ids(30, "b")})
    return MixtureSampler(mix, 8, phases=phases, seed=1, rank=0, world_size=1)


def per_dataset(batches):
    out = {0: [], 1: []}
    for b in batches:
        for d, i in b:
            out[d].append(i)
    return out


def test_new_mixture_weights_go_on_from_where_each_dataset_stopped():
    before = mixture([Phase(0, {"a": 0.5, "b": 0.5})])
    it = iter(before)
    first = [next(it) for _ in range(5)]
    state = before.state_dict()
    after = mixture([Phase(0, {"a": 0.9, "b": 0.1})])
    after.load_state_dict(state)  # new weights are not a new order: each dataset goes on where it stopped
    it = iter(after)
    rest = [next(it) for _ in range(20)]
    got = per_dataset(first + rest)
    # each dataset's draws are its own order, whatever the weights: the continuation of where it stopped
    ref = mixture([Phase(0, {"a": 0.5, "b": 0.5})])
    for d in (0, 1):
        assert got[d] == [ref._sample(d, k) for k in range(len(got[d]))], d
    new = per_dataset(rest)
    assert len(new[0]) == 144 and len(new[1]) == 16  # the new weights: 0.9 and 0.1 of 20 batches of 8


def test_a_phase_schedule_switches_weights_at_its_step_and_each_dataset_goes_on():
    s = mixture([Phase(0, {"a": 0.5, "b": 0.5}), Phase(4, {"a": 0.0, "b": 1.0})])
    it = iter(s)
    batches = [next(it) for _ in range(8)]
    assert all(d == 1 for b in batches[4:] for d, _ in b)
    got = per_dataset(batches)
    assert got[1] == [s._sample(1, k) for k in range(len(got[1]))]
    assert torch.tensor(got[1][:30]).unique().numel() == 30  # no draw repeated within an epoch of b


class Draws(Ids):
    def get_batch(self, B, generator):
        return torch.randint(0, self.n, (B,), generator=generator)


def stream(rank, world):
    from niels_gpt.loading import RankBatchStream

    return RankBatchStream(Draws(), None, seed=3, rank=rank, world_size=world, draw_rows=1, batch_schedule=RAMP)


def test_a_stream_follows_the_schedule_and_resumes_mid_ramp_on_another_world_size():
    whole, _ = run(stream, 1, 10)
    assert [len(b) for b in whole] == [4, 4, 4, 8, 8, 8, 8, 16, 16, 16]
    first, state = run(stream, 1, 4)
    rest, _ = run(stream, 4, 6, state)
    assert first + rest == whole


def test_a_stream_refuses_a_batch_size_the_schedule_does_not_end_at():
    """As GlobalBatchSampler does: a global_batch_size beside a schedule is its last batch, or refused (it was
    ignored without a word)."""
    from niels_gpt.loading import RankBatchStream

    with pytest.raises(ConfigError, match=r"global_batch_size 4 with a batch schedule ending at 16"):
        RankBatchStream(Draws(), 4, seed=3, rank=0, world_size=1, draw_rows=1, batch_schedule=RAMP)
    assert RankBatchStream(Draws(), 16, seed=3, rank=0, world_size=1, draw_rows=1, batch_schedule=RAMP).schedule.steps == RAMP


@pytest.mark.parametrize("size, said", [(8.0, "global_batch_size=8.0 (float) is not a global batch size"),
                                        (True, "global_batch_size=True (bool)"),
                                        (0, "global_batch_size=0 is not a global batch size: it must be at least 1")])
def test_every_sampler_refuses_a_global_batch_size_that_is_not_a_positive_int_in_the_same_words(size, said):
    """MixtureSampler took 8.0 or True and failed inside torch on its first batch; GlobalBatchSampler called a plain
    size of 0 a 'batch schedule [(0, 0)]'. Each names its own argument now, as the readers do."""
    from niels_gpt.loading import RankBatchStream

    for make in (lambda g: GlobalBatchSampler(range(100), g, seed=0, rank=0, world_size=1),
                 lambda g: RankBatchStream(range(100), g, seed=0, rank=0, world_size=1),
                 lambda g: MixtureSampler(MixtureDataset({"a": range(50)}), g, weights={"a": 1}, seed=0, rank=0,
                                          world_size=1)):
        with pytest.raises(ConfigError, match=r"^\w+: " + said.replace("(", r"\(").replace(")", r"\)")):
            make(size)
