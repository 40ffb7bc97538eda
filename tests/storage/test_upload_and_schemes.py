"""Uploads commit with their markers last (a killed upload leaves no meta.json), and every URL that
cannot be served is one clear error naming what to install or use, with nothing written locally."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from niels_gpt.cache.build_cache import build_pretrain_cache
from niels_gpt.cache.cli import main
from niels_gpt.cache.pretrain_dataset import PretrainTokenStreamDataset
from niels_gpt.errors import ConfigError, IncompleteCacheError
from niels_gpt.loading.windows import IndexedWindowDataset
from niels_gpt.packing import PackedMemmapDataset, pack_sft
from niels_gpt.storage import RemoteCache, upload_tree
from niels_gpt.train.data import TrainData

from ..conftest import write_pretrain_cache, write_sft_cache

KILLER = textwrap.dedent("""
    import os, signal, sys
    from niels_gpt.storage import filesystem, upload_tree
    src, url, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    fs, _ = filesystem(url, write=True)
    real, done = fs.put_file, [0]
    def put_file(lpath, rpath, **kw):
        if done[0] == n:
            os.kill(os.getpid(), signal.SIGKILL)  # mid-upload, no cleanup of any kind
        done[0] += 1
        return real(lpath, rpath, **kw)
    fs.put_file = put_file
    upload_tree(src, url, fs=fs)
""")


def _kill_upload_after(src, url, n):
    proc = subprocess.run([sys.executable, "-c", KILLER, str(src), url, str(n)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == -9, proc.stderr


def test_an_upload_killed_midway_leaves_no_meta_json(s3, tmp_path):
    fs, bucket = s3
    write_pretrain_cache(tmp_path / "c", {"train": [np.arange(300) % 50] * 4, "val": [np.arange(100) % 50]})
    _kill_upload_after(tmp_path / "c", f"{bucket}/c", 3)
    fs.invalidate_cache()
    names = [p.rsplit("/", 1)[1] for p in fs.find(f"{bucket}/c")]
    assert len(names) == 3 and "meta.json" not in names
    with pytest.raises(IncompleteCacheError, match=rf"no meta\.json at {bucket}/c: the upload was interrupted"):
        PretrainTokenStreamDataset(f"{bucket}/c/train", T=8, device="cpu")


def test_a_killed_reupload_withdraws_the_old_meta_json_first(s3, tmp_path):
    fs, bucket = s3
    write_pretrain_cache(tmp_path / "old", {"train": [np.arange(300) % 50] * 3})
    write_pretrain_cache(tmp_path / "new", {"train": [np.arange(300) % 40] * 3})
    upload_tree(tmp_path / "old", f"{bucket}/c")
    assert IndexedWindowDataset(f"{bucket}/c", 8)[0]["input_ids"].tolist() == list(range(8))
    _kill_upload_after(tmp_path / "new", f"{bucket}/c", 1)  # one new shard over an old one, then killed
    fs.invalidate_cache()
    assert not fs.exists(f"{bucket}/c/meta.json")  # old files and new ones mixed: not a cache
    with pytest.raises(IncompleteCacheError, match="no meta.json"):
        RemoteCache(f"{bucket}/c")
    upload_tree(tmp_path / "new", f"{bucket}/c")
    assert IndexedWindowDataset(f"{bucket}/c", 8)[5]["input_ids"].tolist() == [(40 + i) % 40 for i in range(8)]


def test_markers_are_uploaded_last_deepest_first(tmp_path):
    pytest.importorskip("fsspec")
    write_pretrain_cache(tmp_path / "tree" / "pretrain" / "a", {"train": [np.arange(20)]})
    write_sft_cache(tmp_path / "tree" / "sft" / "b", [[1, 2, 3]])
    written = upload_tree(tmp_path / "tree", "memory://order-test/x")
    tail = [w.rsplit("/x/", 1)[1] for w in written[-2:]]
    assert tail == ["pretrain/a/meta.json", "sft/b/meta.json"]
    assert all(not w.endswith("meta.json") for w in written[:-2])


def test_packed_bins_round_trip_through_s3(s3, tmp_path):
    _, bucket = s3
    rng = np.random.default_rng(0)
    cache = write_sft_cache(tmp_path / "sft", [[4, *rng.integers(10, 200, rng.integers(3, 40)).tolist(), 5,
                                                *rng.integers(10, 200, 5).tolist(), 6] for _ in range(40)])
    local_manifest = pack_sft(cache, tmp_path / "packed", pack_size=128)
    assert pack_sft(cache, f"{bucket}/packed", pack_size=128) == local_manifest
    local, remote = PackedMemmapDataset(tmp_path / "packed"), PackedMemmapDataset(f"{bucket}/packed")
    assert len(local) == len(remote) > 0
    for i in range(len(local)):
        for key in ("input_ids", "loss_mask", "seq_boundaries"):
            assert np.array_equal(np.asarray(local[i][key]), np.asarray(remote[i][key]))


def test_build_all_to_s3_then_train_batches_from_it(s3, tmp_path, monkeypatch, capsys):
    _, bucket = s3
    monkeypatch.chdir(tmp_path)
    url = f"{bucket}/cache"
    assert main(["build-all", "--sample", "--only", "wikitext", "--cache-dir", url, "--no-progress"]) == 0
    assert main(["build-all", "--sample", "--only", "wikitext", "--cache-dir", "local", "--no-progress"]) == 0
    assert f"uploaded to {url}" in capsys.readouterr().out
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    remote = PretrainTokenStreamDataset(f"{url}/pretrain/wikitext/train", T=32, device="cpu")
    local = PretrainTokenStreamDataset("local/pretrain/wikitext/train", T=32, device="cpu")
    assert torch.equal(remote.get_batch(B=4, generator=g1)[0], local.get_batch(B=4, generator=g2)[0])
    for sampling in ("random", "indexed"):  # train's loader over the URL finds the val split in the mirror
        data = TrainData(f"{url}/pretrain/wikitext", T=32, batch_size=2, seed=0, device="cpu", sampling=sampling)
        assert data.has_val and len(data.val_batches(1)) == 1
    fs, _ = s3
    assert fs.cat_file(f"{url}/tokenizer/meta.json") == (tmp_path / "local/tokenizer/meta.json").read_bytes()
    assert not list(tmp_path.glob("s3:*"))


@pytest.mark.parametrize("url, match", [
    ("nosuch://bucket/out", r"nosuch://bucket/out: the URL scheme 'nosuch' is not supported; use one of .*s3://"),
    ("https://example.invalid/out", r"https:// is read-only"),
])
def test_unsupported_or_read_only_urls_are_refused_before_building(url, match, tmp_path, monkeypatch, tokenizer):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=match):
        build_pretrain_cache(["x"], url, tokenizer=tokenizer, max_train_tokens=10, max_val_tokens=0,
                             shard_bytes=1 << 20, seed=0, shuffle_buffer=None)
    assert list(tmp_path.iterdir()) == []


def test_a_scheme_whose_backend_is_missing_names_the_extra(tmp_path, monkeypatch):
    try:
        import gcsfs  # noqa: F401
        pytest.skip("gcsfs is installed here")
    except ImportError:
        pass
    with pytest.raises(ConfigError, match=r"gs://bucket/c: the gs:// backend is not installed .*pip install 'niels_gpt\[gcs\]'"):
        IndexedWindowDataset("gs://bucket/c", 8)


def test_a_staged_build_reuses_the_remote_tokenizer_and_does_not_upload_it_again(tmp_path):
    fsspec = pytest.importorskip("fsspec")
    from niels_gpt.storage import staged_output

    fs = fsspec.filesystem("memory")
    write_sft_cache(tmp_path / "tree" / "tokenizer", [[1, 2]])  # any marked directory stands in for it
    upload_tree(tmp_path / "tree", "memory://prefetch-test/c")
    before = fs.info("/prefetch-test/c/tokenizer/meta.json")["created"]
    with staged_output("memory://prefetch-test/c", prefetch=("tokenizer",)) as stage:
        assert (stage / "tokenizer" / "meta.json").read_bytes() == (tmp_path / "tree/tokenizer/meta.json").read_bytes()
        write_sft_cache(stage / "sft" / "x", [[3, 4]])
    assert fs.exists("/prefetch-test/c/sft/x/meta.json")
    assert fs.info("/prefetch-test/c/tokenizer/meta.json")["created"] == before
    fs.rm("/prefetch-test", recursive=True)


def test_the_build_command_writes_to_s3(s3, tmp_path, monkeypatch, tokenizer, capsys):
    fs, bucket = s3
    monkeypatch.chdir(tmp_path)
    lines = "".join(f'{{"text": "document {i} says hello to the storage layer"}}\n' for i in range(200))
    (tmp_path / "docs.jsonl").write_text(lines)
    args = ["docs.jsonl", "--tokenizer", tokenizer.model_path, "--val-frac", "0.1", "--no-progress"]
    assert main(["build", *args, "--out", f"{bucket}/mine"]) == 0
    assert main(["build", *args, "--out", "local/mine"]) == 0
    assert fs.cat_file(f"{bucket}/mine/meta.json") == (tmp_path / "local/mine/meta.json").read_bytes()
    x_remote = IndexedWindowDataset(f"{bucket}/mine", 16)[0]["input_ids"]
    assert torch.equal(x_remote, IndexedWindowDataset("local/mine", 16)[0]["input_ids"])
    assert not list(tmp_path.glob("s3:*"))
