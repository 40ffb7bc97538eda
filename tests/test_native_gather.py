"""The optional C window gather (niels_gpt/_native/gather.c) and the numpy path give the same batches.

Every batch is checked against windows cut by hand from the shard arrays, on uint16 and uint32 caches
whose split has an empty-of-windows shard in the middle (so the draw -> shard mapping has ties) and
shapes that end inside, on, and past the kernel's 512-token blocks. The native half is skipped only
where the extension is not built, with the loader's reason.
"""

import pickle
import sys
import types

import numpy as np
import pytest
import torch

from niels_gpt import _native
from niels_gpt.cache.pretrain_dataset import PretrainTokenStreamDataset

from .conftest import write_pretrain_cache

native_built = pytest.mark.skipif(_native.gather is None,
                                  reason=f"native gather extension not built: {_native.UNAVAILABLE}")
SHAPES = [(1, 1), (5, 7), (3, 512), (3, 513), (4, 1100), (64, 40)]
SHARD_SIZES = [1500, 90, 40, 2600, 1300]  # shard 2 (40 tokens) has no window once T >= 40
DTYPES = {"uint16-le": (np.uint16, 60_000), "uint32-le": (np.uint32, 4_000_000_000)}


def _shards(dtype: str) -> list[np.ndarray]:
    np_dtype, low = DTYPES[dtype]
    g = torch.Generator().manual_seed(3)
    return [(low + torch.randint(5000, (n,), generator=g).numpy()).astype(np_dtype) for n in SHARD_SIZES]


@pytest.fixture(scope="module", params=sorted(DTYPES))
def cache(request, tmp_path_factory):
    shards = _shards(request.param)
    out = tmp_path_factory.mktemp(request.param)
    write_pretrain_cache(out, {"train": shards}, dtype=request.param, vocab_size=1 << 32)
    return out, shards


def _expected(ds: PretrainTokenStreamDataset, shards, B: int, seed: int):
    shard, local = ds.sample_starts(B, torch.Generator().manual_seed(seed))
    w = np.stack([shards[k][s:s + ds.T + 1] for k, s in zip(shard, local, strict=True)]).astype(np.int64)
    return torch.from_numpy(w[:, :-1]), torch.from_numpy(w[:, 1:])


def _batch(ds: PretrainTokenStreamDataset, B: int, seed: int):
    return ds.get_batch(B=B, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("B,T", SHAPES)
def test_numpy_path_batches_are_the_drawn_windows(cache, monkeypatch, B, T):
    monkeypatch.setattr(_native, "gather", None)
    out, shards = cache
    ds = PretrainTokenStreamDataset(str(out / "train"), T=T, device="cpu")
    for seed in range(3):
        x, y = _batch(ds, B, seed)
        ex, ey = _expected(ds, shards, B, seed)
        assert torch.equal(x, ex) and torch.equal(y, ey)


@native_built
@pytest.mark.parametrize("B,T", SHAPES)
def test_native_path_is_byte_identical_to_numpy_path(cache, monkeypatch, B, T):
    out, shards = cache
    ds = PretrainTokenStreamDataset(str(out / "train"), T=T, device="cpu")
    native = [_batch(ds, B, seed) for seed in range(3)]
    monkeypatch.setattr(_native, "gather", None)
    for seed, (x, y) in enumerate(native):
        nx, ny = _batch(ds, B, seed)
        ex, ey = _expected(ds, shards, B, seed)
        assert x.dtype == y.dtype == torch.int64 and x.is_contiguous() and y.is_contiguous()
        assert torch.equal(x, nx) and torch.equal(y, ny)
        assert torch.equal(x, ex) and torch.equal(y, ey)


@native_built
def test_native_path_uses_the_kernel(cache, monkeypatch):
    out, _ = cache
    calls = []
    real = _native.gather

    class Spy:
        def __getattr__(self, name):
            fn = getattr(real, name)
            return lambda *a: (calls.append(name), fn(*a))[1]

    monkeypatch.setattr(_native, "gather", Spy())
    ds = PretrainTokenStreamDataset(str(out / "train"), T=16, device="cpu")
    _batch(ds, 4, 0)
    assert calls == ["draws_to_rows", "gather_xy"]


@native_built
def test_native_batches_while_prefetching_cold_windows(cache, monkeypatch):
    out, shards = cache
    ds = PretrainTokenStreamDataset(str(out / "train"), T=100, device="cpu")
    ds.core.open()
    ds.core.cold = True  # the path taken after a gather that waited on the disk
    x, y = _batch(ds, 8, 5)
    ex, ey = _expected(ds, shards, 8, 5)
    assert torch.equal(x, ex) and torch.equal(y, ey)


@native_built
def test_native_path_after_pickling(cache):
    out, shards = cache
    ds = PretrainTokenStreamDataset(str(out / "train"), T=64, device="cpu")
    _batch(ds, 2, 0)
    clone = pickle.loads(pickle.dumps(ds))  # a DataLoader worker maps the shards again
    x, y = _batch(clone, 16, 9)
    ex, ey = _expected(clone, shards, 16, 9)
    assert torch.equal(x, ex) and torch.equal(y, ey)


@native_built
def test_draws_to_rows_matches_searchsorted_at_every_shard_boundary():
    cum = np.array([0, 10, 10, 10, 25, 26, 40], dtype=np.int64)  # shards 1 and 2 have no window start
    shift = np.array([0, 100, 200, 300, 400, 500], dtype=np.int64)
    draws = np.array([0, 9, 10, 24, 25, 26, 39], dtype=np.int64)
    expected = draws + shift[np.searchsorted(cum, draws, side="right") - 1]
    got = draws.copy()
    _native.gather.draws_to_rows(got.ctypes.data, len(got), cum.ctypes.data, len(shift), shift.ctypes.data)
    assert got.tolist() == expected.tolist() == [0, 9, 310, 324, 425, 526, 539]


@native_built
@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_gather_xy_writes_x_then_y(dtype):
    src = np.array([7, 65535, 0, 3, 9], dtype=dtype)
    rows = np.array([2, 0], dtype=np.int64)
    out = np.full(2 * 2 * 2 + 3, -1, dtype=np.int64)  # (2, B=2, T=2), then 3 guard slots
    _native.gather.gather_xy(src.ctypes.data, src.itemsize, rows.ctypes.data, 2, 2, out.ctypes.data)
    assert out[:8].reshape(2, 2, 2).tolist() == [[[0, 3], [7, 65535]], [[3, 9], [65535, 0]]]
    assert out[8:].tolist() == [-1, -1, -1]  # nothing written past y


@native_built
def test_gather_xy_rejects_bad_arguments():
    with pytest.raises(ValueError, match="itemsize must be 2 or 4"):
        _native.gather.gather_xy(0, 8, 0, 1, 1, 0)
    with pytest.raises(TypeError, match="takes 6 arguments"):
        _native.gather.gather_xy(0, 2, 0, 1, 1)
    with pytest.raises(TypeError, match="takes 5 arguments"):
        _native.gather.draws_to_rows(0, 0, 0, 1)


def test_env_var_forces_the_numpy_path(monkeypatch):
    monkeypatch.setenv(_native.NO_NATIVE_ENV, "1")
    assert _native._load() == (None, f"{_native.NO_NATIVE_ENV} is set")


def test_stale_build_is_refused(monkeypatch):
    stale = types.ModuleType("niels_gpt._native._gather")
    stale.ABI = _native.ABI - 1
    stale.__file__ = "_gather.so"
    monkeypatch.delenv(_native.NO_NATIVE_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "niels_gpt._native._gather", stale)
    monkeypatch.setattr(_native, "_gather", stale, raising=False)
    gather, why = _native._load()
    assert gather is None
    assert why == f"_gather.so is a stale build (ABI {_native.ABI - 1}, expected {_native.ABI}): " \
                  "rebuild it with `pip install -e .`"


def test_missing_build_falls_back(monkeypatch):
    monkeypatch.delenv(_native.NO_NATIVE_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "niels_gpt._native._gather", None)  # import raises ImportError
    monkeypatch.delattr(_native, "_gather", raising=False)
    gather, why = _native._load()
    assert gather is None
    assert why.startswith("niels_gpt._native._gather is not built or does not load")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("use_native", [True, False])
def test_cuda_batches_equal_cpu_batches(cache, monkeypatch, use_native):
    out, _ = cache
    if not use_native:
        monkeypatch.setattr(_native, "gather", None)
    cpu = PretrainTokenStreamDataset(str(out / "train"), T=300, device="cpu")
    gpu = PretrainTokenStreamDataset(str(out / "train"), T=300, device="cuda")
    x, y = _batch(gpu, 6, 2)
    cx, cy = _batch(cpu, 6, 2)
    assert x.device.type == y.device.type == "cuda"
    assert torch.equal(x.cpu(), cx) and torch.equal(y.cpu(), cy)
