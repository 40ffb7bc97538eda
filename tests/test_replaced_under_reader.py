"""A cache replaced between opening a dataset and its first batch is refused, never mapped past its end.

Datasets validate sizes when they are opened and map the files on the first batch (per process). A
rebuild swaps a new cache in by rename; one with smaller shards, mapped at the old sizes, used to raise
SIGBUS in the batch kernel (seen by bench/campaign.py's reader-during-rebuild race). Each file is now
sized through the descriptor it is mapped from and must match what the dataset was opened with.
"""

import os

import numpy as np
import pytest
import torch

from niels_gpt import _native
from niels_gpt.cache.pretrain_dataset import PretrainTokenStreamDataset
from niels_gpt.cache.sft_dataset import SFTExampleDataset
from niels_gpt.errors import CacheMismatchError

from .conftest import SPECIALS, write_pretrain_cache, write_sft_cache


def _swap(old_path, new_bytes: bytes) -> None:
    """Replace a file by rename, as a rebuild's swap does (the old inode is never truncated)."""
    tmp = old_path.with_name(old_path.name + ".new")
    tmp.write_bytes(new_bytes)
    os.replace(tmp, old_path)


@pytest.mark.parametrize("use_native", [True, False])
@pytest.mark.parametrize("concatenated", [True, False])
def test_pretrain_shard_replaced_by_a_shorter_one_is_refused(tmp_path, monkeypatch, use_native, concatenated):
    if not use_native:
        monkeypatch.setattr(_native, "gather", None)
    if not concatenated:
        monkeypatch.setattr("niels_gpt.readers.windows_core.open_concatenated", lambda *a, **k: None)
    rng = np.random.default_rng(0)
    cache = write_pretrain_cache(tmp_path / "c", {"train": [rng.integers(0, 2000, 50_000), rng.integers(0, 2000, 9_000)],
                                                  "val": [rng.integers(0, 2000, 100)]})
    ds = PretrainTokenStreamDataset(str(cache / "train"), T=64, device="cpu")
    _swap(cache / "train" / "shard_00000.bin", np.arange(300, dtype="<u2").tobytes())
    with pytest.raises(CacheMismatchError, match=r"shard_00000.bin: 600 bytes now, 100000 when the dataset was opened"):
        ds.get_batch(B=8, generator=torch.Generator().manual_seed(0))


def test_pretrain_dataset_mapped_before_the_swap_keeps_serving_the_old_bytes(tmp_path):
    rng = np.random.default_rng(1)
    cache = write_pretrain_cache(tmp_path / "c", {"train": [rng.integers(0, 2000, 20_000)], "val": [[1, 2, 3]]})
    ds = PretrainTokenStreamDataset(str(cache / "train"), T=32, device="cpu")
    before = ds.get_batch(B=4, generator=torch.Generator().manual_seed(3))
    _swap(cache / "train" / "shard_00000.bin", np.zeros(40, dtype="<u2").tobytes())
    after = ds.get_batch(B=4, generator=torch.Generator().manual_seed(3))
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_sft_tokens_replaced_by_a_shorter_file_are_refused(tmp_path):
    a, e, u = SPECIALS["asst"], SPECIALS["eot"], SPECIALS["usr"]
    cache = write_sft_cache(tmp_path / "s", [[u, 10, 11, e, a, 12, 13, e]] * 50)
    ds = SFTExampleDataset(str(cache / "train_tokens.bin"), str(cache / "train_idx.npy"), T=16, device="cpu",
                           eot_id=e)
    _swap(cache / "train_tokens.bin", np.array([u, 10, e], dtype="<u2").tobytes())
    with pytest.raises(CacheMismatchError, match="train_tokens.bin: 6 bytes now, 800 when the dataset was opened"):
        ds.get_batch(B=4, generator=torch.Generator().manual_seed(0))


def test_indexed_windows_list_and_map_shards_like_the_other_readers(tmp_path):
    """Indexed windows refuse a stray shard on open and a replaced shard on first use, as the
    random-window reader does (one shard listing, readers.shards; one mapping, readers.mmap)."""
    from niels_gpt.errors import CacheError
    from niels_gpt.loading import IndexedWindowDataset

    rng = np.random.default_rng(2)
    cache = write_pretrain_cache(tmp_path / "c", {"train": [rng.integers(0, 2000, 5_000)], "val": [[1, 2, 3]]})
    ds = IndexedWindowDataset(str(cache), 16)
    _swap(cache / "train" / "shard_00000.bin", np.zeros(40, dtype="<u2").tobytes())
    with pytest.raises(CacheMismatchError, match="80 bytes now, 10000 when the dataset was opened"):
        ds[0]
    fresh = write_pretrain_cache(tmp_path / "d", {"train": [rng.integers(0, 2000, 5_000)], "val": [[1, 2, 3]]})
    (fresh / "train" / "shard_00007.bin").write_bytes(b"\0\0")
    with pytest.raises(CacheError, match=r"shard_00007.bin not listed in meta.json"):
        IndexedWindowDataset(str(fresh), 16)
