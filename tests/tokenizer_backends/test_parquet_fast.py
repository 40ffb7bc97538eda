"""The on-the-fly Parquet loader: the fast encoder gives its batches, encode threads are a rank's share of the
cores, and it runs ahead by default."""

from __future__ import annotations

import numpy as np
import pytest

from niels_gpt.errors import ConfigError
from niels_gpt.loading import ParquetTokenLoader
from niels_gpt.loading import parquet as parquet_module
from niels_gpt.tokenizer import load_tokenizer
from niels_gpt.tokenizer.fast import ENV, fast_encoder

from ..conftest import sample_texts
from ..loading.conftest import write_parquet

pytest.importorskip("gigatoken")


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    paras = [p for t in sample_texts() for p in t.split("\n\n") if p.strip()]
    out = tmp_path_factory.mktemp("pq")
    write_parquet(out / "shard_00000.parquet", paras[: len(paras) // 2], row_group_size=32)
    write_parquet(out / "shard_00001.parquet", paras[len(paras) // 2:], row_group_size=32)
    return sorted(out.glob("*.parquet"))


def _batches(files, tok, n: int, **kw) -> list[np.ndarray]:
    loader = ParquetTokenLoader(files, tok, 4, 64, rank=0, world_size=1, bos_id=0, **kw)
    try:
        return [np.concatenate([x.numpy(), y.numpy()[:, -1:]], axis=1) for x, y in (next(loader) for _ in range(n))]
    finally:
        loader.close()


@pytest.mark.parametrize("packing", ["contiguous", "bestfit"])
def test_the_loader_encodes_with_the_fast_encoder_and_gives_the_reference_batches(shards, tiktoken_file, packing,
                                                                                   monkeypatch):
    tok = load_tokenizer(tiktoken_file)
    assert fast_encoder(tok) is not None
    fast = _batches(shards, tok, 12, packing=packing)
    assert tok.__dict__["_fast_encoder"].sampled  # the loader's first batch was checked and encoded by it
    monkeypatch.setenv(ENV, "reference")
    reference_tok = load_tokenizer(tiktoken_file)
    assert fast_encoder(reference_tok) is None
    reference = _batches(shards, reference_tok, 12, packing=packing, prefetch=0)
    assert all(np.array_equal(a, b) for a, b in zip(fast, reference, strict=True))


def test_the_loader_runs_ahead_by_default(shards, tiktoken_file):
    loader = ParquetTokenLoader(shards, load_tokenizer(tiktoken_file), 2, 32, rank=0, world_size=1, bos_id=0)
    try:
        assert loader._ahead is not None and loader._ahead.depth == parquet_module.PREFETCH > 0
        x, _ = next(loader)
        assert x.shape == (2, 32) and loader.batches == 1
    finally:
        loader.close()


@pytest.mark.parametrize("cores, local_world, want", [(16, "8", 2), (16, None, 16), (16, "32", 1), (3, "2", 1),
                                                      (16, "x", 16)])
def test_encode_threads_are_the_ranks_share_of_its_cores(monkeypatch, cores, local_world, want):
    monkeypatch.setattr(parquet_module.os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    if local_world is None:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", local_world)
    assert parquet_module.rank_threads() == want


def test_a_loader_of_eight_local_ranks_on_sixteen_cores_asks_for_two_threads(shards, tiktoken_file, monkeypatch):
    monkeypatch.setattr(parquet_module.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    loader = ParquetTokenLoader(shards, load_tokenizer(tiktoken_file), 2, 32, rank=0, world_size=1, bos_id=0,
                                prefetch=0)
    assert loader.docs.threads == 2
    loader.close()


def test_tokenizer_threads_below_one_is_refused(shards, tiktoken_file):
    with pytest.raises(ConfigError, match="tokenizer_threads=0: must be >= 1"):
        ParquetTokenLoader(shards, load_tokenizer(tiktoken_file), 2, 32, rank=0, world_size=1, bos_id=0,
                           tokenizer_threads=0, prefetch=0)
