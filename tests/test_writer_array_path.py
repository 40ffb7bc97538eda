"""The writer's array path (tiktoken's arrays, long documents, BOS-first) writes exactly the bytes of its list path."""

from __future__ import annotations

import numpy as np
import pytest

from niels_gpt.errors import CacheError
from niels_gpt.formats.writers import Budgeted, ShardWriter


def written(tmp_path, name, docs, keep_last, position="after", dtype="<u2"):
    dtype = np.dtype(dtype)
    writer = ShardWriter(tmp_path / name, dtype, 1 << 20)
    (tmp_path / name).mkdir()
    sink = Budgeted(writer, 10**9, 7, dtype, "train", position)
    sink.write(docs, keep_last, 0)
    writer.close()
    path = tmp_path / name / "shard_00000.bin"
    return path.read_bytes() if path.exists() else b""


def reference(docs, keep_last, position, eot=7, dtype="<u2"):
    out = []
    for j, d in enumerate(docs):
        d = list(d)
        if j == len(docs) - 1 and keep_last < len(d) + 1:
            d = d[:keep_last - 1]
        out += [eot, *d] if position == "before" else [*d, eot]
    return np.array(out, dtype=dtype).tobytes()


@pytest.mark.parametrize("position", ["after", "before"])
@pytest.mark.parametrize("seed", range(6))
def test_arrays_and_lists_write_the_same_bytes(tmp_path, position, seed):
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, 65536, rng.integers(1 if i else 0, 50)).tolist() for i in range(rng.integers(1, 12))]
    docs = [d for d in docs if d] or [[1]]
    for keep_last in sorted({1, 2, len(docs[-1]), len(docs[-1]) + 1}):
        if keep_last < 1:
            continue
        as_arrays = [np.array(d, dtype=np.uint32) for d in docs]
        mixed = [np.array(d, dtype=np.int32) if i % 2 else d for i, d in enumerate(docs)]
        want = reference(docs, keep_last, position)
        assert written(tmp_path, f"l{keep_last}", docs, keep_last, position) == want
        assert written(tmp_path, f"a{keep_last}", as_arrays, keep_last, position) == want
        assert written(tmp_path, f"m{keep_last}", mixed, keep_last, position) == want


def test_an_array_id_out_of_range_names_its_document(tmp_path):
    docs = [np.array([1, 2], dtype=np.uint32), np.array([3, 70000], dtype=np.uint32)]
    with pytest.raises(CacheError, match="train document 1: token id 70000"):
        written(tmp_path, "bad", docs, 3)


@pytest.mark.parametrize("position", ["after", "before"])
def test_a_separator_inside_an_array_document_is_refused_naming_it(tmp_path, position):
    docs = [np.array([1, 2], dtype=np.uint32), np.array([3, 7, 4], dtype=np.uint32)]
    with pytest.raises(Exception, match="train document 1: the document separator \\(id 7\\) occurs inside"):
        written(tmp_path, "sep", docs, 4, position)


def test_a_negative_id_in_a_signed_array_names_its_document(tmp_path):
    docs = [np.array([1, 2], dtype=np.int32), np.array([3], dtype=np.int32), np.array([-1, 4], dtype=np.int32)]
    with pytest.raises(CacheError, match="train document 2"):
        written(tmp_path, "neg", docs, 3)


def test_uint32_arrays_into_a_uint32_cache_keep_every_id(tmp_path):
    docs = [np.array([70000, 2**32 - 1], dtype=np.uint32), np.array([5], dtype=np.uint32)]
    got = np.frombuffer(written(tmp_path, "wide", docs, 2, dtype="<u4"), dtype="<u4")
    assert got.tolist() == [70000, 2**32 - 1, 7, 5, 7]


native = pytest.importorskip("niels_gpt._native").gather


@pytest.mark.skipif(native is None, reason="the C kernel is not built")
@pytest.mark.parametrize("dtype", ["<u2", "<u4"])
@pytest.mark.parametrize("seed", range(4))
def test_uint32_arrays_go_through_the_kernel_with_the_numpy_paths_bytes(tmp_path, monkeypatch, dtype, seed):
    """The fast encoder's uint32 arrays are converted in one C pass (arrays_to_tokens), to the very bytes of the
    numpy path, a cut last document included."""
    from niels_gpt import _native

    rng = np.random.default_rng(seed)
    docs = [rng.integers(8, 65536, rng.integers(1, 40)).astype(np.uint32) for _ in range(rng.integers(1, 10))]
    calls = []
    real = native.arrays_to_tokens
    monkeypatch.setattr(_native, "gather", type("K", (), {
        "arrays_to_tokens": staticmethod(lambda *a: calls.append(1) or real(*a)),
        "ids_to_tokens": staticmethod(native.ids_to_tokens)}))
    for keep_last in sorted({1, 2, len(docs[-1]), len(docs[-1]) + 1}):
        got = written(tmp_path, f"k{keep_last}", docs, keep_last, dtype=dtype)
        assert got == reference([d.tolist() for d in docs], keep_last, "after", dtype=dtype)
    assert len(calls) == len({1, 2, len(docs[-1]), len(docs[-1]) + 1})
    monkeypatch.setattr(_native, "gather", None)
    assert written(tmp_path, "numpy", docs, 2, dtype=dtype) == reference([d.tolist() for d in docs], 2, "after", dtype=dtype)


@pytest.mark.skipif(native is None, reason="the C kernel is not built")
def test_the_kernel_refuses_what_the_numpy_path_must_name():
    ok = [np.array([1, 2], dtype=np.uint32)]
    assert bytes(native.arrays_to_tokens(ok, 7, 2, 3)) == np.array([1, 2, 7], dtype="=u2").tobytes()
    with pytest.raises(TypeError, match="document 0 is not a uint32 array"):
        native.arrays_to_tokens([np.array([1], dtype=np.int32)], 7, 2, 2)
    with pytest.raises((ValueError, BufferError), match="contiguous"):
        native.arrays_to_tokens([np.array([1, 2, 3], dtype=np.uint32)[::2]], 7, 2, 2)
    with pytest.raises(OverflowError):
        native.arrays_to_tokens([np.array([70000], dtype=np.uint32)], 7, 2, 2)
    with pytest.raises(ValueError, match="eot inside"):
        native.arrays_to_tokens([np.array([7], dtype=np.uint32)], 7, 2, 2)
    with pytest.raises(ValueError, match="keep_last"):
        native.arrays_to_tokens(ok, 7, 2, 4)
    assert bytes(native.arrays_to_tokens([], 7, 2, 1)) == b""


def test_a_separator_id_cut_away_from_the_last_document_is_not_refused(tmp_path):
    """The cut drops the last document's tokens from keep_last - 1 on: an EOT id there is not inside what is kept
    (the kernel sees it and hands over to the numpy path, which cuts first)."""
    docs = [np.array([1, 2], dtype=np.uint32), np.array([3, 4, 7, 5], dtype=np.uint32)]
    assert written(tmp_path, "cut", docs, 3) == np.array([1, 2, 7, 3, 4, 7], dtype="<u2").tobytes()
