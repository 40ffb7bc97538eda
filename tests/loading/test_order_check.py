"""A resume checks its own order: a state carries its order's settings and a digest of the next samples, and
a state whose order would change (seed, data, batch size, code) is refused unless the caller allows it."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import Dataset

from niels_gpt.errors import StateError
from niels_gpt.loading import MixtureDataset, MixtureSampler, RankBatchStream, ResumableDataLoader
from niels_gpt.loading.sampler import GlobalBatchSampler
from niels_gpt.loading.shard_windows import ShardWindowSampler
from niels_gpt.resume import fingerprint


class Ids(Dataset):
    """ds[i] = i, named by its size and a tag (other tags: other data of the same size)."""

    def __init__(self, n=200, tag="a"):
        self.n, self.tag = n, tag

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor(i)

    def fingerprint(self):
        return fingerprint("ids", self.n, self.tag)

    def shard_counts(self):
        return [self.n // 4] * 4

    def get_batch(self, B, generator):
        return torch.randint(0, self.n, (B,), generator=generator)


def take(it, k):
    return [torch.as_tensor(next(it)).tolist() for _ in range(k)]


def global_sampler(ds=None, G=8, seed=1):
    return GlobalBatchSampler(ds or Ids(), G, seed=seed, rank=0, world_size=1)


def shard_sampler(ds=None, G=8, seed=1):
    return ShardWindowSampler(ds or Ids(), G, seed=seed, shards_at_once=2, rank=0, world_size=1)


def stream(ds=None, G=8, seed=1):
    return RankBatchStream(ds or Ids(), G, seed=seed, rank=0, world_size=1)


def mixture(ds=None, G=8, seed=1):
    mix = MixtureDataset({"a": ds or Ids(), "b": Ids(50, "b")})
    return MixtureSampler(mix, G, weights={"a": 0.7, "b": 0.3}, seed=seed, rank=0, world_size=1)


def loader(ds=None, G=8, seed=1):
    ds = ds or Ids()
    return ResumableDataLoader(ds, GlobalBatchSampler(ds, G, seed=seed, rank=0, world_size=1))


def mixture_loader(ds=None, G=8, seed=1):
    s = mixture(ds, G, seed)
    return ResumableDataLoader(s.mixture, s, collate_fn=lambda b: b)


MAKERS = {"global": global_sampler, "shard-window": shard_sampler, "stream": stream, "mixture": mixture,
          "loader": loader, "mixture-loader": mixture_loader}


def state_after(make, k=3, **kw):
    obj = make(**kw)
    it = iter(obj)
    take(it, k)
    return obj.state_dict(), take(it, 4)


@pytest.mark.parametrize("name", MAKERS)
def test_a_state_loads_and_goes_on_identically_when_nothing_changed(name):
    state, rest = state_after(MAKERS[name])
    assert "digest" in state["order"]
    again = MAKERS[name]()
    again.load_state_dict(state)
    assert take(iter(again), 4) == rest


@pytest.mark.parametrize("name", MAKERS)
@pytest.mark.parametrize(("change", "names"), [({"seed": 2}, "seed 1 -> 2"),
                                               ({"ds": Ids(200, "b")}, "fingerprint"),
                                               ({"G": 16}, "global_batch_size 8 -> 16|global batch 8; this stream has 16")])
def test_a_state_whose_order_would_change_is_refused_naming_what_differs(name, change, names):
    state, _ = state_after(MAKERS[name])
    with pytest.raises(StateError, match=names) as err:
        MAKERS[name](**change).load_state_dict(state)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", MAKERS)
def test_allow_new_order_goes_on_from_the_state_position_with_the_new_settings(name):
    state, _ = state_after(MAKERS[name])
    new = MAKERS[name](seed=2)
    new.load_state_dict(state, allow_new_order=True)
    fresh = MAKERS[name](seed=2)
    fresh_it = iter(fresh)
    take(fresh_it, 3)  # the same position, reached by the new settings
    assert take(iter(new), 2) == take(fresh_it, 2)


@pytest.mark.parametrize("name", MAKERS)
def test_a_changed_order_code_is_refused_and_a_state_without_a_digest_still_loads(name):
    state, rest = state_after(MAKERS[name])
    moved = {**state, "order": {**state["order"], "digest": "0" * 16}}
    with pytest.raises(StateError, match="order's code changed"):
        MAKERS[name]().load_state_dict(moved)
    bumped = {**state, "order": {**state["order"], "code": state["order"]["code"] + "0"}}
    with pytest.raises(StateError, match="code"):
        MAKERS[name]().load_state_dict(bumped)
    old = {k: v for k, v in state.items() if k != "order"}  # written before states carried an order
    again = MAKERS[name]()
    again.load_state_dict(old)
    assert take(iter(again), 4) == rest


def test_the_order_does_not_depend_on_the_world_size():
    state = GlobalBatchSampler(Ids(), 8, seed=1, rank=1, world_size=4).state_dict()
    assert state["order"] == GlobalBatchSampler(Ids(), 8, seed=1, rank=0, world_size=2).state_dict()["order"]
    GlobalBatchSampler(Ids(), 8, seed=1, rank=0, world_size=2).load_state_dict(state)
