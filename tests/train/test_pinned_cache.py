"""A run pins the cache it opened: a `build` that replaces the cache while the run trains (other data,
another tokenizer) is named before val bpb, instead of scoring the new cache's val split with the old
tokenizer's byte lengths."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from niels_gpt.errors import CacheError
from niels_gpt.meta import write_meta
from niels_gpt.train.data import TrainData
from niels_gpt.train.train import TrainConfig, train

from ..conftest import write_pretrain_cache
from .conftest import TINY, VOCAB, tokens

TOKEN_BYTES = torch.ones(VOCAB, dtype=torch.int64)


class ReplacedAt:
    """The trainer's own loader; while fetching batch `at`, `replace()` runs (a build swapping the cache in)."""

    def __init__(self, data: TrainData, at: int, replace):
        self.data, self.at, self.replace, self.calls = data, at, replace, 0

    def __getattr__(self, name):
        return getattr(self.data, name)

    def __next__(self):
        self.calls += 1
        if self.calls == self.at:
            self.replace()
        return next(self.data)


def rebuild(cache, **meta_changes):
    """What `build` does to a cache it replaces: the new one built aside, then renamed over the old."""
    def replace():
        new = write_pretrain_cache(cache.with_name("new"), {"train": [tokens(3000, 11)], "val": [tokens(600, 12)]})
        if meta_changes:
            write_meta(str(new), {**json.loads((new / "meta.json").read_text()), **meta_changes})
        os.rename(cache, cache.with_name("old"))
        os.rename(new, cache)
    return replace


@pytest.mark.parametrize("change", [{}, {"tokenizer_sha256": "ab" * 32}])
def test_val_bpb_refuses_a_cache_replaced_while_the_run_trained(tmp_path, pretrain_cache, change):
    cache = shutil.copytree(pretrain_cache, tmp_path / "web")
    cfg = TrainConfig(data=str(cache), out_dir=str(tmp_path / "run"), steps=3, **TINY)
    data = ReplacedAt(TrainData(cache, T=16, batch_size=4, seed=0, device="cpu"), 2, rebuild(cache, **change))
    with pytest.raises(CacheError, match=rf"{cache}: was replaced \(rebuilt with other data or another tokenizer\) "
                                         "while this run trained on it; .* val bpb is not scored: rerun"):
        train(cfg, token_bytes=TOKEN_BYTES, log=lambda *a: None, data=data)
    assert (tmp_path / "run" / "ckpt_000003.pt").is_file()  # the steps trained on what was opened, and saved


def test_a_cache_rebuilt_byte_for_byte_or_moved_is_the_same_cache(tmp_path, pretrain_cache):
    cache = shutil.copytree(pretrain_cache, tmp_path / "web")
    cfg = TrainConfig(data=str(cache), out_dir=str(tmp_path / "run"), steps=3, **TINY)

    def same():
        shutil.copytree(pretrain_cache, cache.with_name("new"))
        os.rename(cache, cache.with_name("old"))
        os.rename(cache.with_name("new"), cache)

    data = ReplacedAt(TrainData(cache, T=16, batch_size=4, seed=0, device="cpu"), 2, same)
    assert train(cfg, token_bytes=TOKEN_BYTES, log=lambda *a: None, data=data).val_bpb
