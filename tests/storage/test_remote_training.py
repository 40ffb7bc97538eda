"""Training straight from a cache URL through a bounded download cache: shards fetched ahead of the
batches that need them, pinned until read, shared by the processes of a host (one download per shard),
damaged transfers fetched once more then refused, every network wait limited, exact resume after a kill."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

from niels_gpt.cache.build_cache import build_pretrain_cache
from niels_gpt.cache.pretrain_dataset import PretrainTokenStreamDataset
from niels_gpt.data import open_dataset
from niels_gpt.errors import CacheMismatchError, ConfigError, FormatError, StorageError
from niels_gpt.loading.sampler import GlobalBatchSampler, ResumableDataLoader
from niels_gpt.loading.shard_windows import ShardWindowSampler
from niels_gpt.loading.stream import RankBatchStream
from niels_gpt.loading.windows import IndexedWindowDataset
from niels_gpt.storage import RemoteCache, configure, upload_tree
from niels_gpt.storage import fs as storage_fs
from niels_gpt.storage.local_cache import NoRoom, Pins, disk_usage, lock_path, make_room

from ..conftest import REPO, sample_texts, write_pretrain_cache

SHARD_TOKENS = 2001  # 4,002 bytes a shard: 20 windows of T=100


def _cache(root, shards=10):
    return write_pretrain_cache(root / "c", {"train": [np.arange(i, i + SHARD_TOKENS) % 2000 for i in range(shards)],
                                             "val": [np.arange(500) % 2000]})


def test_a_bound_of_six_shards_reads_each_shard_once_never_exceeds_the_bound(tmp_path, download_cache,
                                                                              counting_server):
    _cache(tmp_path)
    limit = 6 * 2 * SHARD_TOKENS + 4_000  # six shards and the marker
    configure(cache_dir=download_cache, max_bytes=limit)
    server = counting_server(tmp_path)
    remote = IndexedWindowDataset(f"{server.url}/c", 100)
    local = IndexedWindowDataset(tmp_path / "c", 100)
    s_remote = ShardWindowSampler(remote, 8, seed=4, shards_at_once=2, rank=0, world_size=1)
    s_local = ShardWindowSampler(local, 8, seed=4, shards_at_once=2, rank=0, world_size=1)
    n = 0
    for a, b in zip(ResumableDataLoader(remote, s_remote), ResumableDataLoader(local, s_local), strict=True):
        assert torch.equal(a["input_ids"], b["input_ids"])
        assert disk_usage(download_cache) <= limit
        if n == 0:  # the first batch waited; the plan fetched the next ones meanwhile
            s_remote.prefetcher.wait()
            ahead = [f for b_ in list(s_remote._plan.ahead)[:3] for f in b_[1]]
            assert ahead and all(remote.remote.has(f) for f in ahead)
        n += 1
    assert n == 200 // 8
    s_remote.prefetcher.close()
    gets = server.shard_gets()
    assert sorted(gets) == [f"shard_{i:05d}.bin" for i in range(10)]
    # a second download only for a shard that epoch 1's plan fetched again after epoch 0 evicted it
    next_epoch = set(remote.shard_files(s_remote.permutation(1)[:8 * 64].numpy()))
    assert all(n == 1 or (n == 2 and f"train/{name}" in next_epoch) for name, n in gets.items()), gets
    assert not list((download_cache / "pins").glob("*"))  # closed: nothing pinned any more


def test_a_run_that_says_where_it_ends_fetches_nothing_past_its_last_batch(tmp_path, download_cache, counting_server):
    _cache(tmp_path)
    configure(cache_dir=download_cache, max_bytes=6 * 2 * SHARD_TOKENS + 4_000)
    server = counting_server(tmp_path)
    remote = IndexedWindowDataset(f"{server.url}/c", 100)
    sampler = ShardWindowSampler(remote, 8, seed=4, shards_at_once=2, rank=0, world_size=1)
    sampler.end_after(200 // 8 - 3)  # the epoch but its last three batches
    loader = ResumableDataLoader(remote, sampler)
    taken = [b["input_ids"] for _, b in zip(range(200 // 8 - 3), loader, strict=False)]
    sampler.prefetcher.wait()
    sampler.prefetcher.close()
    needed = set(remote.shard_files(sampler.permutation(0)[:8 * len(taken)].numpy()))
    gets = server.shard_gets()
    assert {f"train/{name}" for name in gets} == needed and set(gets.values()) == {1}, gets
    with pytest.raises(ConfigError, match="expected 0 or more"):
        sampler.end_after(-1)


def test_two_processes_share_one_download_cache_one_download_per_shard(tmp_path, download_cache, counting_server):
    _cache(tmp_path, shards=3)
    server = counting_server(tmp_path, delay_s=0.3)
    go = tmp_path / "go"
    script = textwrap.dedent(f"""
        import json, os, sys, time
        sys.path.insert(0, {str(REPO)!r})
        from niels_gpt.loading.windows import IndexedWindowDataset
        ds = IndexedWindowDataset({server.url + "/c"!r}, 100)
        open({str(tmp_path / "ready")!r}, "w").close()
        while not os.path.exists({str(go)!r}):  # both processes start reading at once
            time.sleep(0.01)
        print(json.dumps([ds[i]["input_ids"][:3].tolist() for i in range(len(ds))]))
    """)
    env = {**os.environ, "NIELS_GPT_CACHE": str(download_cache)}
    other = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
    here = IndexedWindowDataset(f"{server.url}/c", 100)  # this process is the second one
    deadline = time.monotonic() + 60
    while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()
    mine = [here[i]["input_ids"][:3].tolist() for i in range(len(here))]
    theirs = json.loads(other.communicate(timeout=120)[0])
    assert other.returncode == 0
    local = IndexedWindowDataset(tmp_path / "c", 100)
    want = [local[i]["input_ids"][:3].tolist() for i in range(len(local))]
    assert mine == want and theirs == want
    assert server.shard_gets() == {f"shard_{i:05d}.bin": 1 for i in range(3)}


def test_a_damaged_transfer_is_fetched_again_and_a_damaged_shard_refused(tmp_path, download_cache, counting_server):
    _cache(tmp_path, shards=3)
    server = counting_server(tmp_path)
    ds = IndexedWindowDataset(f"{server.url}/c", 100)
    server.corrupt["/c/train/shard_00000.bin"] = 1  # one bad transfer, then the right bytes
    assert ds[0]["input_ids"].tolist() == list(range(100))
    assert server.shard_gets()["shard_00000.bin"] == 2
    server.corrupt["/c/train/shard_00001.bin"] = 2  # bad twice: refused, naming the shard's URL
    with pytest.raises(CacheMismatchError, match=rf"{server.url}/c/train/shard_00001\.bin: sha256 .* differs from "
                                                 r"meta\.json .*\(downloaded 2 times\)"):
        ds[25]
    assert server.shard_gets()["shard_00001.bin"] == 2
    assert not any(p.name.startswith("shard_00001") for p in download_cache.rglob("*"))


def test_a_server_that_stops_answering_ends_in_one_line_naming_the_address(tmp_path, download_cache, monkeypatch):
    import socket

    monkeypatch.setattr(storage_fs, "BACKOFF_S", 0.01)
    configure(cache_dir=download_cache, timeout_s=0.3)
    with socket.socket() as silent:  # accepts connections (the kernel's backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/c"
        t0 = time.monotonic()
        with pytest.raises(StorageError) as info:
            RemoteCache(url)
    assert time.monotonic() - t0 < 10
    text = str(info.value)
    # no answer within the limit is not retried: one attempt, one line
    assert "\n" not in text and text.startswith(f"reading {url}/meta.json: no answer")
    assert text.endswith("(now 0.3 s)")
    assert "--network-timeout" in text


def test_waiting_on_another_process_download_is_limited_too(tmp_path, download_cache, counting_server, monkeypatch):
    import fcntl

    _cache(tmp_path, shards=2)
    server = counting_server(tmp_path)
    monkeypatch.setattr(storage_fs, "BACKOFF_S", 0.01)
    configure(cache_dir=download_cache, timeout_s=0.1)
    rc = RemoteCache(f"{server.url}/c")
    lock = lock_path(rc.root, rc.mirror, "train/shard_00000.bin")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as held:  # as another process downloading it would hold it
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(StorageError, match=rf"{server.url}/c/train/shard_00000\.bin: waited \d+ s for another "
                                               r"process downloading it \(it holds .*\.lock\)"):
            rc.fetch("train/shard_00000.bin")
    assert rc.fetch("train/shard_00000.bin").is_file()  # released: fetched now


def test_eviction_keeps_what_any_live_process_pins(tmp_path):
    root = tmp_path / "dl"
    mirror = root / "remote" / "m"
    mirror.mkdir(parents=True)
    files = []
    (mirror / "meta.json").write_text(json.dumps({"files": {f"f{i}": {} for i in range(4)}}))  # what it fetched
    bound = 400 + (mirror / "meta.json").stat().st_size
    for i in range(4):
        (mirror / f"f{i}").write_bytes(b"x" * 100)
        os.utime(mirror / f"f{i}", ns=(i * 10**9, i * 10**9))  # f0 least recently used
        files.append(str(mirror / f"f{i}"))
    pins = Pins(root)
    pins.set(files[:2])
    (root / "pins" / "999999999-0.txt").write_text(files[2])  # a dead process's pins count for nothing
    make_room(root, bound, 100, set())
    assert sorted(p.name for p in mirror.iterdir()) == ["f0", "f1", "f3", "meta.json"]  # f2 went; f0, f1 pinned
    assert not (root / "pins" / "999999999-0.txt").exists()
    with pytest.raises(NoRoom):
        make_room(root, bound, 250, set(), strict=True)  # only f3 may go: not enough for a prefetch
    make_room(root, bound, 250, set())  # a read that needs the file now goes past the bound instead
    assert sorted(p.name for p in mirror.iterdir()) == ["f0", "f1", "meta.json"]
    pins.close()
    assert not list((root / "pins").iterdir())


RESUME_SCRIPT = """
import json, os, sys, time
sys.path.insert(0, {repo!r})
from niels_gpt.loading.sampler import ResumableDataLoader
from niels_gpt.loading.shard_windows import ShardWindowSampler
from niels_gpt.loading.windows import IndexedWindowDataset
ds = IndexedWindowDataset({url!r}, 100)
loader = ResumableDataLoader(ds, ShardWindowSampler(ds, 8, seed=9, shards_at_once=3, rank=0, world_size=1))
if len(sys.argv) > 1:
    loader.load_state_dict(json.loads(sys.argv[1]))
with open({out!r}, "a") as f:
    for b in loader:
        f.write(json.dumps({{"first": b["input_ids"][:, 0].tolist(), "state": loader.state_dict()}}) + "\\n")
        f.flush()
        time.sleep(0.02)
"""


def test_a_run_killed_mid_epoch_resumes_exactly_from_s3(s3, tmp_path, download_cache):
    _, bucket = s3
    _cache(tmp_path, shards=6)
    upload_tree(tmp_path / "c", f"{bucket}/c")
    out = tmp_path / "batches.jsonl"
    script = RESUME_SCRIPT.format(repo=str(REPO), url=f"{bucket}/c", out=str(out))
    configure(cache_dir=download_cache, max_bytes=24_000)  # four shards: evictions within the epoch
    env = {**os.environ, "NIELS_GPT_CACHE": str(download_cache), "NIELS_GPT_CACHE_MAX_BYTES": "24000"}
    p = subprocess.Popen([sys.executable, "-c", script], env=env)
    deadline = time.monotonic() + 120
    while (not out.exists() or len(out.read_text().splitlines()) < 4) and time.monotonic() < deadline:
        time.sleep(0.01)
    p.send_signal(signal.SIGKILL)
    p.wait(30)
    lines = [line for line in out.read_text().splitlines() if line.endswith("}")]  # a line the kill cut short
    before = [json.loads(line) for line in lines]
    assert 4 <= len(before) < 15
    ds = IndexedWindowDataset(f"{bucket}/c", 100)  # resumed here, from the last state the killed run wrote
    loader = ResumableDataLoader(ds, ShardWindowSampler(ds, 8, seed=9, shards_at_once=3, rank=0, world_size=1))
    loader.load_state_dict(before[-1]["state"])
    after = [b["input_ids"][:, 0].tolist() for b in loader]
    local = IndexedWindowDataset(tmp_path / "c", 100)
    want = [b["input_ids"][:, 0].tolist() for b in
            ResumableDataLoader(local, ShardWindowSampler(local, 8, seed=9, shards_at_once=3, rank=0, world_size=1))]
    assert [b["first"] for b in before] + after == want
    assert disk_usage(download_cache) <= 24_000


def test_compressed_shards_from_s3_serve_the_local_batches_through_a_small_bound(s3, tokenizer, tmp_path,
                                                                                 download_cache):
    _, bucket = s3
    common = dict(tokenizer=tokenizer, max_train_tokens=40_000, max_val_tokens=2_000, shard_bytes=16_384, seed=3,
                  shuffle_buffer=None, progress=False)
    build_pretrain_cache(sample_texts(), str(tmp_path / "raw"), **common)
    build_pretrain_cache(sample_texts(), f"{bucket}/zst", compress="zstd", **common)
    zst_bytes = sorted(int(r["bytes"]) for r in RemoteCache(f"{bucket}/zst").records.values()
                       if "tokens" in r)
    bound = 5 * zst_bytes[-1]  # five compressed shards of six
    configure(cache_dir=download_cache, max_bytes=bound)
    local = PretrainTokenStreamDataset(str(tmp_path / "raw" / "train"), T=300, device="cpu")
    remote = PretrainTokenStreamDataset(f"{bucket}/zst/train", T=300, device="cpu")
    a, b = RankBatchStream(local, 4, seed=1, rank=0, world_size=1), RankBatchStream(remote, 4, seed=1, rank=0,
                                                                                      world_size=1)
    for _ in range(12):
        (xa, ya), (xb, yb) = next(a), next(b)
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
        assert disk_usage(download_cache) <= bound
    assert b._plan is not None and b._plan.prefetcher.pinned  # the stream planned its next draws
    assert remote.core.frames is not None and remote.core.frames.loaded > 0
    c = RankBatchStream(remote, 4, seed=1, rank=0, world_size=1)
    c.end_after(2)  # a run of two steps: the plan holds step 1 while step 0 is read, then nothing
    next(c)
    assert [pos for pos, _ in c._plan.ahead] == [1]
    next(c)
    assert not c._plan.ahead
    c._plan.prefetcher.close()


def test_open_dataset_takes_cache_urls(s3, tmp_path):
    _, bucket = s3
    _cache(tmp_path, shards=2)
    upload_tree(tmp_path / "c", f"{bucket}/c")
    ds = open_dataset(f"{bucket}/c", T=100)
    assert isinstance(ds, IndexedWindowDataset) and ds.split == "train" and len(ds) == 40
    assert torch.equal(ds[3]["input_ids"], IndexedWindowDataset(tmp_path / "c", 100)[3]["input_ids"])
    val = open_dataset(f"{bucket}/c/val", T=50)
    assert val.split == "val" and len(val) == 9
    with pytest.raises(FormatError, match=r"'nope' is not a split of the cache at s3://"):
        open_dataset(f"{bucket}/c/nope", T=50)
    sampler = GlobalBatchSampler(ds, 4, seed=0, rank=0, world_size=1)
    assert len(next(iter(sampler))) == 4 and sampler.prefetcher is not None
    sampler.prefetcher.close()
