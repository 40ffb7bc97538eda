"""Bad settings and changed files met through the Python API (the CLI side is the catalogue,
tests/test_bad_input_catalogue.py): seeds, budgets, shard sizes, and SFT indexes changed after the build."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from niels_gpt.cache.build_cache import build_pretrain_cache, build_sft_cache
from niels_gpt.cache.sft_dataset import SFTExampleDataset
from niels_gpt.errors import NielsGPTError
from niels_gpt.formats.convert import convert
from niels_gpt.formats.writers import MIN_SHARD_BYTES
from niels_gpt.packing.pack import pack_sft
from niels_gpt.packing.source import open_sft_split
from niels_gpt.seeds import SEED_MAX

from .conftest import sample_texts

CHATS = [[{"role": "user", "content": f"What is {i} times 3?"}, {"role": "assistant", "content": f"It is {3 * i}."}]
         for i in range(30)]


def _pretrain(out, tokenizer, **kw):
    args = dict(tokenizer=tokenizer, max_train_tokens=4000, max_val_tokens=400, shard_bytes=4096, seed=0,
                shuffle_buffer=None, progress=False, num_workers=1)
    args.update(kw)
    build_pretrain_cache([t for t in sample_texts() if t.strip()], str(out), **args)


@pytest.fixture(scope="module")
def sft_cache(tmp_path_factory, tokenizer):
    out = tmp_path_factory.mktemp("sft") / "chat"
    build_sft_cache(CHATS, str(out), tokenizer=tokenizer, val_frac=0.1, seed=0)
    return out


@pytest.mark.parametrize("seed", [-1, SEED_MAX + 1, 2**64, 1.5, "7"])
def test_every_builder_refuses_a_seed_torch_cannot_take(seed, tokenizer, sft_cache, tmp_path):
    with pytest.raises(NielsGPTError, match="seed"):
        _pretrain(tmp_path / "p", tokenizer, seed=seed)
    with pytest.raises(NielsGPTError, match="seed"):
        build_sft_cache(CHATS, str(tmp_path / "s"), tokenizer=tokenizer, val_frac=0.1, seed=seed)
    with pytest.raises(NielsGPTError, match="seed"):
        pack_sft(sft_cache, tmp_path / "packed", pack_size=128, seed=seed)
    assert not any(tmp_path.rglob("meta.json")) and not any(tmp_path.rglob("manifest.json"))


def test_the_largest_seed_is_accepted(tokenizer, tmp_path):
    _pretrain(tmp_path / "p", tokenizer, seed=SEED_MAX)
    assert (tmp_path / "p" / "meta.json").is_file()


def test_budgets_of_zero_and_zero_are_named_as_such(tokenizer, tmp_path):
    with pytest.raises(NielsGPTError, match="max_train_tokens and max_val_tokens are both 0"):
        _pretrain(tmp_path / "p", tokenizer, max_train_tokens=0, max_val_tokens=0)
    assert not (tmp_path / "p").exists()


def test_shards_below_the_minimum_are_refused_by_the_builder_and_convert(tokenizer, tmp_path):
    with pytest.raises(NielsGPTError, match=f"at least {MIN_SHARD_BYTES} bytes"):
        _pretrain(tmp_path / "p", tokenizer, shard_bytes=2)
    assert not (tmp_path / "p").exists()
    _pretrain(tmp_path / "ok", tokenizer, shard_bytes=MIN_SHARD_BYTES)  # the minimum itself is fine
    with pytest.raises(NielsGPTError, match=f"at least {MIN_SHARD_BYTES} bytes"):
        convert(tmp_path / "ok", tmp_path / "n", to="niels", shard_bytes=MIN_SHARD_BYTES - 1)
    with pytest.raises(NielsGPTError, match="max-tokens-per-file=1"):
        convert(tmp_path / "ok", tmp_path / "n", to="nanogpt", max_tokens_per_file=1)
    assert not (tmp_path / "n").exists()


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_a_pickled_index_is_refused_without_unpickling(sft_cache, tmp_path):
    c = _copy(sft_cache, tmp_path / "c")
    np.save(c / "train_idx.npy", np.array([0, 4, 9], dtype=object), allow_pickle=True)
    with pytest.raises(NielsGPTError, match="train_idx.npy"):
        open_sft_split(c, "train")
    with pytest.raises(NielsGPTError, match="train_idx.npy"):
        pack_sft(c, tmp_path / "packed", pack_size=128)
    assert not (tmp_path / "packed").exists()


def test_an_index_changed_after_the_build_is_caught_on_open(sft_cache, tokenizer, tmp_path):
    c = _copy(sft_cache, tmp_path / "c")
    idx = np.load(c / "train_idx.npy")
    idx[3] += 1  # still increasing, still in range: only its sha256 tells
    np.save(c / "train_idx.npy", idx)
    with pytest.raises(NielsGPTError, match="train_idx.npy.*sha256|sha256.*train_idx.npy"):
        SFTExampleDataset(str(c / "train_tokens.bin"), str(c / "train_idx.npy"), T=64, device="cpu",
                          eot_id=tokenizer.special_ids["eot"])
    with pytest.raises(NielsGPTError, match="sha256"):
        open_sft_split(c, "train")
