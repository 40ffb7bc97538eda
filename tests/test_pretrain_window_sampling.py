"""Contract acceptance test 2: random windows, y[:, :-1] == x[:, 1:], ids within the vocabulary."""

import pickle

import numpy as np
import pytest
import torch

from niels_gpt.cache.build_cache import build_pretrain_cache
from niels_gpt.cache.pretrain_dataset import PretrainTokenStreamDataset
from niels_gpt.errors import CacheError, CacheMismatchError, ConfigError, IncompleteCacheError

from .conftest import write_pretrain_cache


@pytest.fixture(scope="module")
def built_cache(tmp_path_factory, tokenizer, real_docs):
    out = tmp_path_factory.mktemp("c") / "pretrain"
    build_pretrain_cache(real_docs, str(out), tokenizer=tokenizer, max_train_tokens=60_000, max_val_tokens=5_000,
                         shard_bytes=20_000, seed=0, shuffle_buffer=None)
    return out


def test_targets_are_inputs_shifted_and_ids_in_vocab(built_cache, tokenizer):
    ds = PretrainTokenStreamDataset(str(built_cache / "train"), T=128, device="cpu")
    g = torch.Generator().manual_seed(1)
    for _ in range(50):
        x, y = ds.get_batch(B=16, generator=g)
        assert x.shape == y.shape == (16, 128)
        assert x.dtype == y.dtype == torch.int64
        assert x.is_contiguous() and y.is_contiguous()
        assert torch.equal(y[:, :-1], x[:, 1:])
        assert int(x.min()) >= 0 and int(max(x.max(), y.max())) < len(tokenizer)


def test_window_never_crosses_shard_end(tmp_path):
    # Shard k holds k*10_000 + 0, 1, 2, ...: a window is valid iff it is consecutive within one shard.
    shards = [np.arange(n) + k * 10_000 for k, n in enumerate([50, 9, 30, 200])]
    write_pretrain_cache(tmp_path, {"train": shards, "val": [np.arange(20)]}, vocab_size=65_536)
    ds = PretrainTokenStreamDataset(str(tmp_path / "train"), T=9, device="cpu")
    x, y = ds.get_batch(B=4000, generator=torch.Generator().manual_seed(0))
    w = torch.cat([x, y[:, -1:]], dim=1)
    assert (w[:, 1:] - w[:, :-1] == 1).all()
    shard = w[:, 0] // 10_000
    assert set(shard.tolist()) == {0, 2, 3}  # shard 1 (9 tokens) has no 10-token window
    assert ((w[:, -1] % 10_000) < torch.tensor([50, 9, 30, 200])[shard]).all()


def test_shard_drawn_in_proportion_to_window_starts(tmp_path):
    shards = [np.arange(n) + k * 10_000 for k, n in enumerate([110, 1010])]
    write_pretrain_cache(tmp_path, {"train": shards}, vocab_size=65_536)
    ds = PretrainTokenStreamDataset(str(tmp_path / "train"), T=10, device="cpu")
    x, _ = ds.get_batch(B=20_000, generator=torch.Generator().manual_seed(0))
    frac_small = float((x[:, 0] < 10_000).float().mean())
    assert abs(frac_small - 100 / 1100) < 0.01  # 100 of 1100 window starts are in the small shard


def test_same_generator_seed_same_batches(built_cache):
    ds = PretrainTokenStreamDataset(str(built_cache / "train"), T=32, device="cpu")
    a = ds.get_batch(B=8, generator=torch.Generator().manual_seed(7))
    b = ds.get_batch(B=8, generator=torch.Generator().manual_seed(7))
    assert all(torch.equal(p, q) for p, q in zip(a, b, strict=True))


def test_pickles_as_paths_not_memory_maps(built_cache):
    ds = PretrainTokenStreamDataset(str(built_cache / "train"), T=32, device="cpu")
    ds.get_batch(B=2, generator=torch.Generator().manual_seed(0))  # maps the shards
    blob = pickle.dumps(ds)
    assert len(blob) < 20_000
    clone = pickle.loads(blob)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert torch.equal(clone.get_batch(B=4, generator=g1)[0], ds.get_batch(B=4, generator=g2)[0])


def test_rejects_T_plus_1_beyond_every_shard(tmp_path):
    write_pretrain_cache(tmp_path, {"train": [np.arange(10), np.arange(12)]})
    with pytest.raises(ConfigError, match=r"T\+1 = 13 tokens exceeds every shard .*largest has 12"):
        PretrainTokenStreamDataset(str(tmp_path / "train"), T=12, device="cpu")


def test_missing_meta_is_an_unfinished_build(tmp_path):
    (tmp_path / "train").mkdir()
    np.arange(100, dtype="<u2").tofile(tmp_path / "train" / "shard_00000.bin")
    with pytest.raises(IncompleteCacheError, match="no meta.json .*interrupted"):
        PretrainTokenStreamDataset(str(tmp_path / "train"), T=8, device="cpu")


def test_truncated_shard_detected_on_open(tmp_path):
    write_pretrain_cache(tmp_path, {"train": [np.arange(100)]})
    shard = tmp_path / "train" / "shard_00000.bin"
    shard.write_bytes(shard.read_bytes()[:150])
    with pytest.raises(CacheMismatchError, match=r"shard_00000.bin: 150 bytes on disk, meta says 200"):
        PretrainTokenStreamDataset(str(tmp_path / "train"), T=8, device="cpu")


def test_stray_shard_not_in_meta_rejected(tmp_path):
    write_pretrain_cache(tmp_path, {"train": [np.arange(100)]})
    np.arange(10, dtype="<u2").tofile(tmp_path / "train" / "shard_00007.bin")
    with pytest.raises(CacheError, match="shard_00007.bin not listed in meta.json"):
        PretrainTokenStreamDataset(str(tmp_path / "train"), T=8, device="cpu")


def test_uint32_cache_serves_ids_above_65535(tmp_path):
    write_pretrain_cache(tmp_path, {"train": [np.arange(70_000, 70_100)]}, dtype="uint32-le", vocab_size=80_000)
    ds = PretrainTokenStreamDataset(str(tmp_path / "train"), T=8, device="cpu")
    x, _ = ds.get_batch(B=4, generator=torch.Generator().manual_seed(0))
    assert int(x.min()) >= 70_000


def test_cold_cache_prefetch_does_not_change_batches(tmp_path):
    shards = [np.arange(n) + k * 10_000 for k, n in enumerate([5000, 3000, 7000])]
    write_pretrain_cache(tmp_path, {"train": shards}, vocab_size=65_536)
    plain = PretrainTokenStreamDataset(str(tmp_path / "train"), T=100, device="cpu")
    prefetching = PretrainTokenStreamDataset(str(tmp_path / "train"), T=100, device="cpu")
    g1, g2 = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    plain.get_batch(B=1, generator=torch.Generator())  # map the shards
    prefetching.get_batch(B=1, generator=torch.Generator())
    for _ in range(20):
        prefetching.core.cold = True  # as after a gather that waited on the disk: MADV_WILLNEED every window
        a, b = plain.get_batch(B=16, generator=g1), prefetching.get_batch(B=16, generator=g2)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
