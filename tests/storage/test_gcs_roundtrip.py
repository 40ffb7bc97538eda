"""Caches on a Google Cloud Storage endpoint (gcp-storage-emulator, the JSON API gcsfs speaks, on 127.0.0.1):
the same library paths as for S3, through gs:// URLs: a build uploaded byte for byte with meta.json last,
batches equal to the local cache's, a damaged remote shard caught, the CLI's build from and verify of gs://."""

from __future__ import annotations

import json

import pytest
import torch

from niels_gpt.cache.cli import main
from niels_gpt.cache.pretrain_dataset import PretrainTokenStreamDataset
from niels_gpt.errors import CacheMismatchError
from niels_gpt.loading.windows import IndexedWindowDataset

from ..conftest import sample_texts
from .conftest import build_sample_cache, file_tree


def test_build_to_gcs_uploads_the_local_build_byte_for_byte_meta_last(gcs, tokenizer, tmp_path):
    fs, bucket = gcs
    build_sample_cache(tokenizer, tmp_path / "c")
    build_sample_cache(tokenizer, f"{bucket}/c")
    remote = {p.split("/c/", 1)[1]: fs.cat_file(p) for p in fs.find(f"{bucket}/c")}
    assert remote == file_tree(tmp_path / "c")
    assert len([k for k in remote if k.startswith("train/")]) >= 3
    # the commit marker is the last object written (the server stamps each write to the microsecond)
    updated = {p.split("/c/", 1)[1]: fs.info(p)["updated"] for p in fs.find(f"{bucket}/c")}
    last = sorted(updated, key=updated.get)
    assert last[-1] == "meta.json" and updated["meta.json"] > updated[last[-2]]
    assert not list(tmp_path.glob("gs:*"))


def test_random_window_batches_from_gcs_equal_the_local_cache(gcs, tokenizer, tmp_path, download_cache):
    _, bucket = gcs
    build_sample_cache(tokenizer, tmp_path / "local")
    build_sample_cache(tokenizer, f"{bucket}/c")
    g_local, g_remote = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    local = PretrainTokenStreamDataset(str(tmp_path / "local" / "train"), T=64, device="cpu")
    remote = PretrainTokenStreamDataset(f"{bucket}/c/train", T=64, device="cpu")
    for _ in range(6):
        (x0, y0), (x1, y1) = local.get_batch(B=8, generator=g_local), remote.get_batch(B=8, generator=g_remote)
        assert torch.equal(x0, x1) and torch.equal(y0, y1)
    assert any(p.name.startswith("shard_") for p in download_cache.rglob("*"))


def test_a_corrupted_gcs_shard_is_caught_by_its_checksum(gcs, tokenizer, download_cache):
    fs, bucket = gcs
    build_sample_cache(tokenizer, f"{bucket}/c")
    shard = f"{bucket}/c/train/shard_00001.bin"
    data = bytearray(fs.cat_file(shard))
    data[100] ^= 0xFF
    fs.pipe_file(shard, bytes(data))
    ds = IndexedWindowDataset(f"{bucket}/c", 32)
    with pytest.raises(CacheMismatchError, match=r"train/shard_00001\.bin: sha256 .* differs from meta\.json"):
        for i in range(len(ds)):
            ds[i]


def test_cli_builds_from_a_gcs_corpus_to_gcs_and_verify_names_a_damaged_shard(gcs, tokenizer, tmp_path, capsys):
    fs, bucket = gcs
    fs.pipe_file(f"{bucket}/corpus/docs.jsonl",
                 "".join(json.dumps({"text": t}) + "\n" for t in sample_texts()[:8]).encode())
    (tmp_path / "docs.jsonl").write_bytes(fs.cat_file(f"{bucket}/corpus/docs.jsonl"))
    common = ["--tokenizer", str(tokenizer.model_path), "--val-tokens", "2000", "--max-tokens", "30000",
              "--shard-bytes", "16KiB", "--name", "mine", "--no-progress"]
    assert main(["build", f"{bucket}/corpus/*.jsonl", "--out", f"{bucket}/out", *common]) == 0
    assert main(["build", str(tmp_path / "docs.jsonl"), "--out", str(tmp_path / "out"), *common]) == 0
    remote = {p.split("/out/", 1)[1]: fs.cat_file(p) for p in fs.find(f"{bucket}/out")}
    local = file_tree(tmp_path / "out")
    meta_r, meta_l = json.loads(remote.pop("meta.json")), json.loads(local.pop("meta.json"))
    for files in (remote, local, meta_r["files"], meta_l["files"]):
        files.pop("origins.json")  # the origins' inputs: their paths, and a URL's version for a sha256
    assert remote == local  # every shard and origin byte-identical; meta.json differs only where it names the source
    assert meta_r["files"] == meta_l["files"] and meta_r["totals"] == meta_l["totals"]
    capsys.readouterr()
    assert main(["verify", f"{bucket}/out"]) == 0
    shard = f"{bucket}/out/train/shard_00000.bin"
    data = bytearray(fs.cat_file(shard))
    data[7] ^= 0x01
    fs.pipe_file(shard, bytes(data))
    capsys.readouterr()
    assert main(["verify", f"{bucket}/out"]) != 0
    out, err = capsys.readouterr()
    assert "train/shard_00000.bin" in out + err and "sha256" in out + err
