"""Random windows and indexed windows are two samplers over one window core (readers/windows_core.py):
window i of stride s starts at token (i - cum[k]) * s of shard k, never across a shard's end, and both
readers serve the tokens of the same map, local or remote, through the C kernel or numpy alike."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from niels_gpt import _native
from niels_gpt.loading.windows import IndexedWindowDataset, collate_windows
from niels_gpt.readers.pretrain import PretrainTokenStreamDataset
from niels_gpt.storage import configure

from ..conftest import http_server, write_pretrain_cache

# shards of 10, 3 and 7 tokens (the middle one holds no window of T+1 = 4): distinct ids say where a row came from
SHARDS = [np.arange(10) + 100, np.arange(3) + 200, np.arange(7) + 300]


@pytest.fixture
def cache(tmp_path):
    return write_pretrain_cache(tmp_path / "c", {"train": SHARDS, "val": [np.arange(5)]})


def test_window_counts_of_both_strides_skip_a_shard_too_short(cache):
    random = PretrainTokenStreamDataset(str(cache / "train"), T=3, device="cpu")
    indexed = IndexedWindowDataset(cache, 3)
    assert random.core.counts.tolist() == [7, 0, 4] and random.core.cum.tolist() == [0, 7, 7, 11]
    assert indexed.shard_counts() == [3, 0, 2] and indexed.cumulative == [0, 3, 3, 5]
    shard, local = random.core.locate(np.arange(11))
    assert shard.tolist() == [0] * 7 + [2] * 4 and local.tolist() == [*range(7), *range(4)]
    assert [indexed.locate(i) for i in range(5)] == [(0, 0), (0, 3), (0, 6), (2, 0), (2, 3)]


@pytest.mark.parametrize("native", [True, False])
def test_indexed_windows_are_the_random_readers_windows_at_every_T_th_token(cache, monkeypatch, native):
    if not native:
        monkeypatch.setattr(_native, "gather", None)
    elif _native.gather is None:
        pytest.skip("the C kernel is not built here")
    random = PretrainTokenStreamDataset(str(cache / "train"), T=3, device="cpu")
    indexed = IndexedWindowDataset(cache, 3)
    expected = random.gather(np.array([0, 0, 0, 2, 2]), np.array([0, 3, 6, 0, 3])).astype(np.int64)
    assert expected[:, 0].tolist() == [100, 103, 106, 300, 303]
    batch = collate_windows(indexed.__getitems__([4, 0, 3, 1, 2]))
    order = [4, 0, 3, 1, 2]
    assert batch["input_ids"].tolist() == expected[order, :-1].tolist()
    assert batch["labels"].tolist() == expected[order, 1:].tolist()
    for i in range(5):
        assert indexed[i]["input_ids"].tolist() == expected[i, :-1].tolist()
    x, y = random.get_batch(B=64, generator=torch.Generator().manual_seed(0))
    assert torch.equal(x[:, 1:], y[:, :-1]) and set((x[:, 0] // 100).tolist()) == {1, 3}  # never the short shard
    assert ((x[:, -1] - x[:, 0]) == 2).all()  # no row crosses a shard's end


def test_indexed_windows_from_a_url_that_fits_the_bound_map_the_split_whole(tmp_path, download_cache):
    """As the random-window reader does: once every shard of a split that fits the bound is mirrored, the
    split is one map, and the items are the local cache's."""
    shards = [(np.arange(2_001) * (k + 1)) % 2000 for k in range(4)]
    cache = write_pretrain_cache(tmp_path / "c", {"train": shards, "val": [np.arange(50)]})
    configure(cache_dir=download_cache, max_bytes=1 << 20)
    local = IndexedWindowDataset(cache, 64)
    with http_server(tmp_path) as url:
        remote = IndexedWindowDataset(f"{url}/c", 64)
        per_shard = local.shard_counts()[0]
        for k in range(3):
            assert torch.equal(remote[k * per_shard]["labels"], local[k * per_shard]["labels"])
        assert remote.core.flat is None  # a shard not mirrored yet: read shard by shard
        picks = [5, len(local) - 1, 0, 3 * per_shard + 2]
        a, b = collate_windows(remote.__getitems__(picks)), collate_windows(local.__getitems__(picks))
        assert remote.core.flat is not None
        assert all(torch.equal(a[key], b[key]) for key in ("input_ids", "labels"))
