"""Shards are read in numeric order: past 100,000 shards a name grows a digit, and a string sort would put
shard_100000 before shard_99999."""

import json

import numpy as np

from niels_gpt.cache.formats import detect_format
from niels_gpt.cache.pretrain_dataset import PretrainTokenStreamDataset
from niels_gpt.formats.base import file_order
from niels_gpt.formats.kempner import list_token_files
from niels_gpt.loading import IndexedWindowDataset
from niels_gpt.seals import sealed_bytes

from ..conftest import write_pretrain_cache


def test_file_order_reads_digits_as_numbers():
    names = ["shard_100000.bin", "shard_99999.bin", "shard_00002.bin", "b_1.bin", "a_10.npy"]
    assert sorted(names, key=file_order) == ["a_10.npy", "b_1.bin", "shard_00002.bin", "shard_99999.bin",
                                              "shard_100000.bin"]


def test_a_cache_past_99999_shards_is_read_in_numeric_order(tmp_path):
    first, second = np.arange(10, 60, dtype=np.uint16), np.arange(100, 150, dtype=np.uint16)
    cache = write_pretrain_cache(tmp_path / "c", {"train": [first, second], "val": [first]})
    meta = json.loads((cache / "meta.json").read_text())
    for old, new in (("shard_00000.bin", "shard_99999.bin"), ("shard_00001.bin", "shard_100000.bin")):
        (cache / "train" / old).rename(cache / "train" / new)
        meta["files"][f"train/{new}"] = meta["files"].pop(f"train/{old}")
    (cache / "meta.json").write_bytes(sealed_bytes(meta))
    ds = PretrainTokenStreamDataset(str(cache / "train"), T=8, device="cpu")
    assert ds.shard_names == ["shard_99999.bin", "shard_100000.bin"]
    assert [p.rsplit("/", 1)[-1] for p in detect_format(cache / "train").files] == ds.shard_names
    assert IndexedWindowDataset(cache, T=8)[0]["input_ids"][0] == 10  # the stream starts in shard_99999
    (tmp_path / "k").mkdir()
    for name in ("shard_100000.npy", "shard_99999.npy"):
        np.save(tmp_path / "k" / name, first)
    assert [p.name for p in list_token_files(tmp_path / "k")] == ["shard_99999.npy", "shard_100000.npy"]
