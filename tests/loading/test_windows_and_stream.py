"""Indexed windows over a pretraining cache, and the resumable random-window stream."""

import json
import pickle
import re

import numpy as np
import pytest
import torch

from niels_gpt.cache.build_cache import build_pretrain_cache
from niels_gpt.cache.pretrain_dataset import PretrainTokenStreamDataset
from niels_gpt.errors import CacheError, ConfigError, StateError
from niels_gpt.loading import GlobalBatchSampler, IndexedWindowDataset, RankBatchStream, ResumableDataLoader

from ..conftest import write_pretrain_cache


@pytest.fixture
def two_shards(tmp_path):
    return write_pretrain_cache(tmp_path / "c", {"train": [np.arange(10), np.arange(100, 107)],
                                                 "val": [np.arange(5)]})


def test_windows_locate_as_in_the_worked_example(two_shards):
    ds = IndexedWindowDataset(two_shards, T=3)
    assert len(ds) == 5 and ds.cumulative == [0, 3, 5]
    assert ds.locate(4) == (1, 3)
    item = ds[4]
    assert item["input_ids"].tolist() == [103, 104, 105] and item["labels"].tolist() == [104, 105, 106]
    assert ds[2]["input_ids"].tolist() == [6, 7, 8] and ds[2]["labels"].tolist() == [7, 8, 9]
    with pytest.raises(IndexError, match="window 5 out of range"):
        ds[5]


def test_uint32_cache_reads_ids_above_uint16(tmp_path):
    cache = write_pretrain_cache(tmp_path / "c", {"train": [np.array([70000, 70001, 70002], dtype=np.int64)]},
                                 dtype="uint32-le", vocab_size=80000)
    assert IndexedWindowDataset(cache, T=2)[0]["labels"].tolist() == [70001, 70002]


def test_pickled_dataset_carries_no_memmap(two_shards):
    ds = IndexedWindowDataset(two_shards, T=3)
    ds[0]
    assert ds.core.flat is not None
    clone = pickle.loads(pickle.dumps(ds))
    assert clone.core.views is None and clone.core.flat is None
    assert clone[4]["input_ids"].tolist() == [103, 104, 105]


def test_fingerprint_depends_on_T_and_split(two_shards):
    a = IndexedWindowDataset(two_shards, T=3).fingerprint()
    assert a == IndexedWindowDataset(two_shards, T=3).fingerprint()
    assert a != IndexedWindowDataset(two_shards, T=2).fingerprint()
    assert a != IndexedWindowDataset(two_shards, T=3, split="val").fingerprint()


def test_window_longer_than_every_shard_is_rejected(two_shards):
    with pytest.raises(ConfigError, match="T\\+1 = 11 tokens exceeds every shard"):
        IndexedWindowDataset(two_shards, T=10)


def test_missing_split_is_rejected(tmp_path):
    cache = write_pretrain_cache(tmp_path / "c", {"train": [np.arange(10)]})
    with pytest.raises(CacheError, match="lists no val shards"):
        IndexedWindowDataset(cache, T=3, split="val")


def test_truncated_shard_is_rejected(two_shards):
    with open(two_shards / "train" / "shard_00001.bin", "r+b") as f:
        f.truncate(4)
    with pytest.raises(CacheError, match="shard_00001.bin: 4 bytes on disk"):
        IndexedWindowDataset(two_shards, T=3)


@pytest.fixture(scope="module")
def built(tmp_path_factory, tokenizer, real_docs):
    out = tmp_path_factory.mktemp("b") / "pretrain"
    build_pretrain_cache(real_docs, str(out), tokenizer=tokenizer, max_train_tokens=30_000, max_val_tokens=3_000,
                         shard_bytes=16_000, seed=0, shuffle_buffer=None)
    return out


def test_sampler_serves_every_window_of_a_built_cache_once(built, tokenizer):
    ds = IndexedWindowDataset(built, T=64)
    loader = ResumableDataLoader(ds, GlobalBatchSampler(ds, 8, seed=0, rank=0, world_size=1), num_workers=1)
    seen = []
    for batch in loader:
        assert torch.equal(batch["input_ids"][:, 1:], batch["labels"][:, :-1])
        seen += [tuple(r) for r in batch["input_ids"].tolist()]
    expected = {tuple(ds[i]["input_ids"].tolist()) for i in range(len(ds))}
    assert len(seen) == len(ds) // 8 * 8 and set(seen) <= expected
    assert len(tokenizer.decode(seen[0])) > 0


def test_random_window_stream_resumes_exactly(built):
    ds = PretrainTokenStreamDataset(str(built / "train"), T=32, device="cpu")
    full = RankBatchStream(ds, 8, seed=4, rank=1, world_size=2)
    batches = [next(full) for _ in range(6)]
    head = RankBatchStream(ds, 8, seed=4, rank=1, world_size=2)
    for _ in range(3):
        next(head)
    resumed = RankBatchStream(ds, 8, seed=4, rank=1, world_size=2)
    resumed.load_state_dict(json.loads(json.dumps(head.state_dict())))
    for want in batches[3:]:
        got = next(resumed)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert not torch.equal(batches[0][0], batches[1][0])


def test_random_window_stream_with_single_row_draws_is_world_size_independent(built):
    ds = PretrainTokenStreamDataset(str(built / "train"), T=16, device="cpu")
    one = RankBatchStream(ds, 8, seed=1, rank=0, world_size=1, draw_rows=2)
    four = [RankBatchStream(ds, 8, seed=1, rank=r, world_size=4, draw_rows=2) for r in range(4)]
    for _ in range(3):
        x1, _ = next(one)
        x4 = torch.cat([next(s)[0] for s in four])
        assert torch.equal(x1, x4)


def test_stream_state_of_another_cache_or_draw_size_is_rejected(built, two_shards):
    ds = PretrainTokenStreamDataset(str(built / "train"), T=16, device="cpu")
    state = RankBatchStream(ds, 8, seed=1, rank=0, world_size=1).state_dict()
    other = PretrainTokenStreamDataset(str(two_shards / "train"), T=3, device="cpu")
    with pytest.raises(StateError, match="does not match"):
        RankBatchStream(other, 8, seed=1, rank=0, world_size=1).load_state_dict(state)
    with pytest.raises(StateError, match="draw_rows=8"):
        RankBatchStream(ds, 8, seed=1, rank=0, world_size=1, draw_rows=1).load_state_dict(state)
    with pytest.raises(ConfigError, match="must divide the per-rank batch 4"):
        RankBatchStream(ds, 8, seed=1, rank=0, world_size=2, draw_rows=3)


def test_a_batch_over_many_shards_is_one_gather_equal_to_its_items(tmp_path, monkeypatch):
    from niels_gpt import _native

    if _native.gather is None:
        pytest.skip(_native.UNAVAILABLE)
    cache = write_pretrain_cache(tmp_path / "c", {"train": [np.arange(i * 1000, i * 1000 + 50 + 7 * i) % 60000
                                                            for i in range(6)]},
                                 dtype="uint32-le", vocab_size=70000)
    ds = IndexedWindowDataset(cache, T=4)
    calls, real = [], _native.gather

    class Counting:
        def __getattr__(self, name):
            fn = getattr(real, name)
            return lambda *a: (calls.append(name), fn(*a))[1]

    monkeypatch.setattr(_native, "gather", Counting())
    indices = [len(ds) - 1, 0, 13, 27, 40, 41, 55, 62, 3]
    batch = ds.__getitems__(indices)
    assert calls.count("gather_xy") == 1
    for row, i in enumerate(indices):
        assert torch.equal(batch.x[row], ds[i]["input_ids"]) and torch.equal(batch.y[row], ds[i]["labels"])
    assert batch.x.dtype == torch.int64 and batch.x.is_contiguous() and batch.y.is_contiguous()
    with pytest.raises(IndexError, match=f"window {len(ds)} out of range"):
        ds.__getitems__([0, len(ds)])
    with pytest.raises(IndexError, match="window -1 out of range"):
        ds.__getitems__(np.array([-1, 0]))


@pytest.mark.parametrize("bad", [1.5, "1", True, np.float64(2.0)])
def test_a_window_index_that_is_not_an_integer_is_refused_not_cut(two_shards, bad):
    """ds[1.5] read window 1 and ds.__getitems__(["1"]) parsed the string; an index of another type is a TypeError,
    alone or in a batch, as SFTExampleDataset's is."""
    ds = IndexedWindowDataset(two_shards, T=3)
    with pytest.raises(TypeError, match=f"IndexedWindowDataset indices are integers, got {re.escape(repr(bad))}"):
        ds[bad]
    with pytest.raises(TypeError, match="IndexedWindowDataset indices are integers"):
        ds.__getitems__([bad, 0] if not isinstance(bad, bool) else [bad])
    assert ds.__getitems__([np.int64(4), 0]).x.tolist() == [[103, 104, 105], [0, 1, 2]]
    assert ds[torch.tensor(4)]["input_ids"].tolist() == [103, 104, 105]  # `for i in torch.randperm(n): ds[i]`


def test_draw_rows_that_is_not_a_positive_int_is_refused_not_cut(two_shards):
    """draw_rows=2.5 ran as 2 (int()): the stream's draws, and so its batches, were another setting's."""
    ds = PretrainTokenStreamDataset(str(two_shards / "train"), T=3, device="cpu")
    with pytest.raises(ConfigError, match=r"RankBatchStream: draw_rows=2.5 \(float\) is not a row count"):
        RankBatchStream(ds, 4, seed=0, rank=0, world_size=1, draw_rows=2.5)
    with pytest.raises(ConfigError, match="draw_rows 3 must divide the per-rank batch 4"):
        RankBatchStream(ds, 4, seed=0, rank=0, world_size=1, draw_rows=3)


def test_a_cache_given_for_a_split_or_a_split_for_a_cache_is_named_as_such(two_shards):
    """PretrainTokenStreamDataset takes <cache>/<split>, IndexedWindowDataset the cache: given the other, each said
    "no meta.json ...: the build was interrupted or never ran; re-run build-all", about a cache that is complete."""
    with pytest.raises(ConfigError, match=rf"{re.escape(str(two_shards))}: a cache \(it holds meta.json\), not one of its "
                                          rf"splits: pass a split directory, e.g. {re.escape(str(two_shards / 'train'))}"):
        PretrainTokenStreamDataset(str(two_shards), T=3, device="cpu")
    with pytest.raises(ConfigError, match=rf"{re.escape(str(two_shards / 'val'))}: a split directory of the cache "
                                          rf"{re.escape(str(two_shards))}: pass the cache, .* \(with split='val'\)"):
        IndexedWindowDataset(two_shards / "val", T=3)
