"""Caches on a real S3 endpoint (moto server) and over HTTP: batches, resume state and packed bins read
from a URL equal the local cache's, byte for byte; every download is checked and the local copy bounded."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from niels_gpt.cache.build_cache import build_sft_cache
from niels_gpt.cache.pretrain_dataset import PretrainTokenStreamDataset
from niels_gpt.cache.sft_dataset import SFTExampleDataset
from niels_gpt.errors import CacheMismatchError, ConfigError
from niels_gpt.loading.sampler import GlobalBatchSampler, ResumableDataLoader
from niels_gpt.loading.windows import IndexedWindowDataset
from niels_gpt.meta import file_record, write_meta
from niels_gpt.storage import RemoteCache, configure, upload_tree

from ..conftest import sample_texts, write_pretrain_cache, write_sft_cache
from .conftest import build_sample_cache, file_tree, http_server


def _batches(ds, n=6, B=8, seed=11):
    g = torch.Generator().manual_seed(seed)
    out = [ds.get_batch(B=B, generator=g) for _ in range(n)]
    return out, g.get_state()


def test_build_to_s3_uploads_the_local_build_byte_for_byte(s3, tokenizer, tmp_path):
    fs, bucket = s3
    build_sample_cache(tokenizer, tmp_path / "wikitext")
    build_sample_cache(tokenizer, f"{bucket}/wikitext")
    local = file_tree(tmp_path / "wikitext")
    remote = {p.split("/wikitext/", 1)[1]: fs.cat_file(p) for p in fs.find(f"{bucket}/wikitext")}
    assert remote == local
    assert len([k for k in local if k.startswith("train/")]) >= 3
    assert not list(tmp_path.glob("s3:*"))


def test_random_window_batches_from_s3_equal_the_local_cache(s3, tokenizer, tmp_path, download_cache):
    _, bucket = s3
    build_sample_cache(tokenizer, tmp_path / "local")
    build_sample_cache(tokenizer, f"{bucket}/c")
    want, want_state = _batches(PretrainTokenStreamDataset(str(tmp_path / "local" / "train"), T=64, device="cpu"))
    ds = PretrainTokenStreamDataset(f"{bucket}/c/train", T=64, device="cpu")
    got, got_state = _batches(ds)
    for (x0, y0), (x1, y1) in zip(want, got, strict=True):
        assert torch.equal(x0, x1) and torch.equal(y0, y1)
    assert torch.equal(want_state, got_state)
    # a second dataset finds everything mirrored: the local path, the same batches again
    again, _ = _batches(PretrainTokenStreamDataset(f"{bucket}/c/train", T=64, device="cpu"))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(want, again, strict=True))


def test_sft_batches_from_s3_equal_the_local_cache(s3, tokenizer, tmp_path):
    _, bucket = s3
    chats = [[{"role": "user", "content": f"question {i}: {t[:80]}"},
              {"role": "assistant", "content": t[80:200]}] for i, t in enumerate(sample_texts()[:30])]
    build_sft_cache(chats, str(tmp_path / "sft"), tokenizer=tokenizer, val_frac=0.1, seed=1)
    build_sft_cache(chats, f"{bucket}/sft", tokenizer=tokenizer, val_frac=0.1, seed=1)
    eot = tokenizer.special_ids["eot"]
    local = SFTExampleDataset(str(tmp_path / "sft" / "train_tokens.bin"), str(tmp_path / "sft" / "train_idx.npy"),
                              T=48, device="cpu", eot_id=eot)
    remote = SFTExampleDataset(f"{bucket}/sft/train_tokens.bin", f"{bucket}/sft/train_idx.npy",
                               T=48, device="cpu", eot_id=eot)
    for a, b in zip(_batches(local)[0], _batches(remote)[0], strict=True):
        assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))


def test_indexed_windows_resume_state_is_the_same_remote_and_local(s3, tokenizer, tmp_path):
    _, bucket = s3
    build_sample_cache(tokenizer, tmp_path / "local")
    build_sample_cache(tokenizer, f"{bucket}/c")

    def run(path, state=None, n=3):
        ds = IndexedWindowDataset(path, 32)
        loader = ResumableDataLoader(ds, GlobalBatchSampler(ds, 8, seed=5, rank=0, world_size=1))
        if state is not None:
            loader.load_state_dict(state)
        it = iter(loader)
        batches = [next(it)["input_ids"] for _ in range(n)]
        return ds, batches, loader.state_dict()

    ds_l, local, state_l = run(tmp_path / "local")
    ds_r, remote, state_r = run(f"{bucket}/c")
    assert ds_l.fingerprint() == ds_r.fingerprint() and len(ds_l) == len(ds_r)
    assert state_l == state_r
    assert all(torch.equal(a, b) for a, b in zip(local, remote, strict=True))
    _, more_l, _ = run(tmp_path / "local", state_l)
    _, more_r, _ = run(f"{bucket}/c", state_r)
    assert all(torch.equal(a, b) for a, b in zip(more_l, more_r, strict=True))


def test_a_corrupted_remote_shard_is_caught_by_its_checksum(s3, tokenizer, tmp_path, download_cache):
    fs, bucket = s3
    build_sample_cache(tokenizer, f"{bucket}/c")
    shard = f"{bucket}/c/train/shard_00001.bin"
    data = bytearray(fs.cat_file(shard))
    data[100] ^= 0xFF
    fs.pipe_file(shard, bytes(data))  # same size, one byte flipped
    ds = IndexedWindowDataset(f"{bucket}/c", 32)
    with pytest.raises(CacheMismatchError, match=r"train/shard_00001\.bin: sha256 .* differs from meta\.json"):
        for i in range(len(ds)):
            ds[i]
    mirrored = {p.name for p in download_cache.rglob("*") if p.is_file()}
    assert "shard_00001.bin" not in mirrored and not any(".tmp-" in n for n in mirrored)


def test_the_local_cache_stays_within_its_bound(tmp_path, download_cache):
    shards = [np.arange(i * 1000, i * 1000 + 1000) % 2000 for i in range(6)]  # 2,000 bytes each
    write_pretrain_cache(tmp_path / "local", {"train": shards})
    bound = 5_000  # two shards and a meta.json, never three shards
    configure(cache_dir=download_cache, max_bytes=bound)
    with http_server(tmp_path) as base:
        remote = IndexedWindowDataset(f"{base}/local", 99)
        local = IndexedWindowDataset(tmp_path / "local", 99)
        order = torch.randperm(len(local), generator=torch.Generator().manual_seed(0)).tolist()
        for i in order + order[:7]:
            assert torch.equal(remote[i]["input_ids"], local[i]["input_ids"])
            used = sum(p.stat().st_size for p in (download_cache / "remote").rglob("*") if p.is_file()
                       and p.name != "meta.json")
            assert used <= bound
        batches, _ = _batches(PretrainTokenStreamDataset(f"{base}/local/train", T=50, device="cpu"), n=10)
    want, _ = _batches(PretrainTokenStreamDataset(str(tmp_path / "local" / "train"), T=50, device="cpu"), n=10)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(want, batches, strict=True))


def test_a_file_larger_than_the_bound_is_a_clear_error(tmp_path, download_cache):
    write_pretrain_cache(tmp_path / "local", {"train": [np.arange(3000) % 2000]})
    configure(cache_dir=download_cache, max_bytes=1000)
    with http_server(tmp_path) as base:
        ds = IndexedWindowDataset(f"{base}/local", 9)
        with pytest.raises(ConfigError, match="one file needs 6,000 bytes but the local cache .* may hold 1,000"):
            ds[0]


def test_http_is_read_only(tmp_path, tokenizer):
    with pytest.raises(ConfigError, match=r"https://example\.invalid/c: https:// is read-only"):
        build_sft_cache([], "https://example.invalid/c", tokenizer=tokenizer, val_frac=0.0, seed=0)


def test_a_rebuilt_remote_cache_replaces_the_mirrored_files(s3, tokenizer, tmp_path, download_cache):
    fs, bucket = s3
    write_pretrain_cache(tmp_path / "a", {"train": [np.arange(500) % 7]})
    write_pretrain_cache(tmp_path / "b", {"train": [np.arange(500) % 11]})

    upload_tree(tmp_path / "a", f"{bucket}/c")
    assert IndexedWindowDataset(f"{bucket}/c", 9)[3]["input_ids"].tolist() == (np.arange(27, 36) % 7).tolist()
    upload_tree(tmp_path / "b", f"{bucket}/c")
    assert IndexedWindowDataset(f"{bucket}/c", 9)[3]["input_ids"].tolist() == (np.arange(27, 36) % 11).tolist()
    assert RemoteCache(f"{bucket}/c").records["train/shard_00000.bin"]["sha256"] != \
        RemoteCache(f"file://{tmp_path}/a").records["train/shard_00000.bin"]["sha256"]


def test_each_rank_downloads_only_the_shards_its_indices_reach(s3, tmp_path):
    _, bucket = s3

    write_pretrain_cache(tmp_path / "c", {"train": [np.arange(i, i + 41) for i in range(8)]})  # 5 windows each
    upload_tree(tmp_path / "c", f"{bucket}/c")
    for rank in (0, 1):
        downloads = tmp_path / f"rank{rank}"
        configure(cache_dir=downloads)
        ds = IndexedWindowDataset(f"{bucket}/c", 8)
        batch = next(iter(GlobalBatchSampler(ds, 4, seed=0, rank=rank, world_size=2, prefetch=False)))
        for i in batch:
            ds[i]
        reached = {ds.paths[ds.locate(i)[0]].name for i in batch}
        assert {p.name for p in downloads.rglob("*.bin")} == reached


def test_dataloader_workers_read_a_remote_cache_like_a_local_one(s3, tmp_path):
    _, bucket = s3

    write_pretrain_cache(tmp_path / "c", {"train": [np.arange(i, i + 401) % 2000 for i in range(4)]})
    upload_tree(tmp_path / "c", f"{bucket}/c")

    def batches(path):
        ds = IndexedWindowDataset(path, 16)
        loader = ResumableDataLoader(ds, GlobalBatchSampler(ds, 8, seed=2, rank=0, world_size=1), num_workers=2)
        return [b["input_ids"] for b in loader]

    assert all(torch.equal(a, b) for a, b in zip(batches(tmp_path / "c"), batches(f"{bucket}/c"), strict=True))


def test_a_flaky_server_is_retried_and_a_dead_one_named(tmp_path):
    from http.server import ThreadingHTTPServer

    from niels_gpt.errors import StorageError

    from .conftest import _QuietHandler

    write_pretrain_cache(tmp_path / "c", {"train": [np.arange(100), np.arange(100, 200)]})
    failures = {"left": 0}

    class Flaky(_QuietHandler):
        def do_GET(self):
            if self.path.endswith(".bin") and failures["left"] > 0:
                failures["left"] -= 1
                self.send_error(503, "busy")
                return
            super().do_GET()

        do_HEAD = do_GET

    import functools
    import threading

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Flaky, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        ds = IndexedWindowDataset(f"{base}/c", 9)
        failures["left"] = 1
        assert ds[0]["input_ids"].tolist() == list(range(9))
        failures["left"] = 100
        with pytest.raises(StorageError, match=r"downloading http://127\.0\.0\.1:\d+/c/train/shard_00001\.bin: failed 4 times"):
            ds[len(ds) - 1]
    finally:
        server.shutdown()
        server.server_close()


def test_an_sft_cache_with_a_stored_mask_reads_from_a_url_like_the_local_one(tmp_path, download_cache):
    """A chat-template cache keeps its mask in train_mask.bin; over a URL that file is fetched on first use,
    and its size is checked against meta.json's record (it is not on the disk when the dataset opens)."""
    examples = [[4, 10 + i, 5, *range(20, 20 + i % 9), 6] for i in range(23)]
    cache = write_sft_cache(tmp_path / "c", examples)
    meta = json.loads((cache / "meta.json").read_text())
    meta["special_token_ids"]["asst"] = None
    mask = np.random.default_rng(0).integers(0, 2, sum(map(len, examples))).astype(np.uint8)
    mask.tofile(cache / "train_mask.bin")
    meta["files"]["train_mask.bin"] = file_record(cache / "train_mask.bin", None)
    write_meta(str(cache), meta)
    local = SFTExampleDataset(str(cache / "train_tokens.bin"), str(cache / "train_idx.npy"), T=10, device="cpu",
                              eot_id=6)
    with http_server(tmp_path) as url:
        remote = SFTExampleDataset(f"{url}/c/train_tokens.bin", f"{url}/c/train_idx.npy", T=10, device="cpu",
                                   eot_id=6)
        for a, b in zip(_batches(local, B=5)[0], _batches(remote, B=5)[0], strict=True):
            assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))
