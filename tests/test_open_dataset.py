"""`open_dataset`: one door that returns, for each kind of data the library writes or reads, the dataset
that serves it, with the same items as that dataset opened directly."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from niels_gpt.cache.build_cache import build_pretrain_cache, build_sft_cache
from niels_gpt.cache.sft_dataset import SFTExampleDataset
from niels_gpt.data import open_dataset
from niels_gpt.errors import NielsGPTError
from niels_gpt.formats.convert import convert
from niels_gpt.formats.kempner_dataset import MemoryMappedDataset
from niels_gpt.loading.windows import IndexedWindowDataset
from niels_gpt.packing.dataset import PackedMemmapDataset
from niels_gpt.packing.pack import pack_sft

from .conftest import sample_texts

CHATS = [[{"role": "user", "content": f"Spell {i}."}, {"role": "assistant", "content": f"{i} is spelled {i}."}]
         for i in range(24)]


@pytest.fixture(scope="module")
def data(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("door")
    build_pretrain_cache([t for t in sample_texts() if t.strip()], str(root / "pre"), tokenizer=tokenizer,
                         max_train_tokens=6000, max_val_tokens=600, shard_bytes=4096, seed=0,
                         shuffle_buffer=None, progress=False, num_workers=1)
    build_sft_cache(CHATS, str(root / "sft"), tokenizer=tokenizer, val_frac=0.2, seed=0)
    pack_sft(root / "sft", root / "packed", pack_size=64)
    for to in ("nanogpt", "kempner-npy", "megatron"):
        convert(root / "pre", root / to, to=to)
    return root


def _same(a, b):
    assert len(a) == len(b) > 0
    for i in (0, len(a) // 2, len(a) - 1):
        x, y = a[i], b[i]
        assert x.keys() == y.keys()
        for k in x:
            assert torch.equal(torch.as_tensor(x[k]), torch.as_tensor(y[k])), k


def test_a_pretraining_cache_opens_as_indexed_windows(data):
    ds = open_dataset(data / "pre", T=32)
    assert type(ds) is IndexedWindowDataset and ds.split == "train"
    _same(ds, IndexedWindowDataset(data / "pre", 32))
    val = open_dataset(data / "pre" / "val", T=32)  # a split directory names its split
    assert val.split == "val"
    _same(val, IndexedWindowDataset(data / "pre", 32, split="val"))
    assert open_dataset(data / "pre", T=32, split="val").split == "val"


def test_an_sft_cache_opens_with_its_recorded_eot(data, tokenizer):
    ds = open_dataset(data / "sft", T=48)
    assert type(ds) is SFTExampleDataset
    direct = SFTExampleDataset(str(data / "sft" / "train_tokens.bin"), str(data / "sft" / "train_idx.npy"), T=48,
                               device="cpu", eot_id=tokenizer.special_ids["eot"])
    idx = np.arange(len(direct))
    for a, b in zip(ds.collate(idx), direct.collate(idx), strict=True):
        assert torch.equal(a, b)
    val = open_dataset(data / "sft", T=48, split="val")
    assert val.idx_path.name == "val_idx.npy" and 0 < len(val) < len(ds)


def test_packed_bins_open_as_packed_and_take_no_T(data):
    ds = open_dataset(data / "packed")
    assert type(ds) is PackedMemmapDataset
    _same(ds, PackedMemmapDataset(data / "packed"))
    with pytest.raises(NielsGPTError, match="packed bins have the length they were packed with"):
        open_dataset(data / "packed", T=64)


@pytest.mark.parametrize("to", ["nanogpt", "kempner-npy", "megatron"])
def test_a_peers_token_files_open_with_the_peers_semantics(data, to):
    ds = open_dataset(data / to, T=32)
    assert type(ds) is MemoryMappedDataset
    _same(ds, MemoryMappedDataset(data / to, 32, split="train"))
    # the same tokens as our cache: a peer's window i is our tokens [i*33, i*33+33) of the train stream
    ours = IndexedWindowDataset(data / "pre", 32)
    stream = np.concatenate([np.memmap(p, dtype=ours.dtype, mode="r") for p in ours.paths])
    assert ds[1]["input_ids"].tolist() == stream[33:65].astype(np.int64).tolist()


@pytest.mark.parametrize("T", [None, 0, -3, 2.5, True])
def test_a_window_length_is_required_and_positive(data, T):
    with pytest.raises(NielsGPTError, match="T="):
        open_dataset(data / "pre", T=T)


def test_paths_that_hold_no_training_data_are_named(data, tokenizer, tmp_path):
    with pytest.raises(NielsGPTError, match="no such file or directory"):
        open_dataset(tmp_path / "nowhere", T=8)
    with pytest.raises(NielsGPTError, match="holds no tokens to train on"):
        open_dataset(Path(tokenizer.model_path).parent, T=8)
    (tmp_path / "empty").mkdir()
    with pytest.raises(NielsGPTError, match="empty"):
        open_dataset(tmp_path / "empty", T=8)


def test_a_split_the_library_cannot_make_names_the_splits_there_and_what_to_do(data):
    """A cache holds train and val: asking for 'test' says which splits it has and how to get a test set, never to
    'build the cache with a test split' (no command makes one)."""
    from niels_gpt.errors import ConfigError

    for cache in (data / "pre", data / "sft"):
        with pytest.raises(ConfigError) as err:
            open_dataset(cache, T=32, split="test")
        line = str(err.value)
        assert "\n" not in line and "no split 'test'" in line, line
        assert re.search(r"this cache has train \([\d,]+ tokens\), val \([\d,]+ tokens\)", line), line
        assert "split='val'" in line and "build FILES --out cache/NAME-test" in line, line
        assert "with a test split" not in line
