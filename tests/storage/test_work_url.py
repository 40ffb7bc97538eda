"""A build's work directory at a URL (niels_gpt/storage/work.py), on fsspec's memory:// store: the guard's verdicts,
the tokenizer fetched once per node by its sha256, and the cleanup deleting only the build's own objects."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from niels_gpt.builders.parallel import remove_work_url
from niels_gpt.errors import ConfigError
from niels_gpt.storage import configure, reset
from niels_gpt.storage.work import WorkStore, check_work_url, fetch_tokenizer, upload_tokenizer
from niels_gpt.tokenizer import load_tokenizer


@pytest.fixture
def store():
    return WorkStore(f"memory://work-{uuid.uuid4().hex[:8]}/w")


def test_the_guard_takes_an_empty_prefix_and_a_resumed_build_of_the_same_output(store):
    assert check_work_url(store, "s3://b/out") == (True, {})
    store.put_bytes("plan.json", json.dumps({"tasks": [], "out": "s3://b/out", "work_dir_created": True}).encode())
    store.put_bytes("parts/00000-0123456789ab.json", b"{}")
    created, found = check_work_url(store, "s3://b/out")
    assert created is True and set(found) == {"plan.json", "parts/00000-0123456789ab.json"}


def test_the_guard_refuses_someones_objects_and_another_builds_plan(store):
    store.put_bytes("notes.txt", b"mine")
    with pytest.raises(ConfigError, match=r"--work-dir memory://.*holds 1 object\(s\) that are not a build's work "
                                          r"files \(notes.txt\)"):
        check_work_url(store, "s3://b/out")
    store.remove("notes.txt")
    store.put_bytes("plan.json", json.dumps({"tasks": [], "out": "s3://b/other"}).encode())
    with pytest.raises(ConfigError, match=r"holds the plan of a build of s3://b/other, not of s3://b/out"):
        check_work_url(store, "s3://b/out")


def test_the_tokenizer_is_fetched_once_per_node_by_its_sha256(store, tokenizer, download_cache, monkeypatch):
    url = upload_tokenizer(store, tokenizer.model_path, tokenizer.sha256, {})
    assert url.endswith(f"/tokenizer/{tokenizer.sha256}/spm.model")
    fetched = []
    real = WorkStore.get_file
    monkeypatch.setattr(WorkStore, "get_file", lambda self, rel, local: (fetched.append(rel), real(self, rel, local)))
    first = fetch_tokenizer(url, tokenizer.sha256)
    assert sorted(fetched) == ["meta.json", "spm.model"]
    assert fetch_tokenizer(url, tokenizer.sha256) == first and len(fetched) == 2  # the node's copy, not again
    assert first.is_relative_to(download_cache) and load_tokenizer(first).sha256 == tokenizer.sha256


def test_the_cleanup_deletes_only_the_builds_objects(store):
    for rel in ("plan.json", "parts/00000-0123456789ab.bin", "parts/00000-0123456789ab.json",
                "parts/00000-0123456789ab.bin.tmp-7", f"tokenizer/{'a' * 64}/spm.model"):
        store.put_bytes(rel, b"x")
    store.put_bytes("parts/readme.txt", b"not ours")
    remove_work_url(store)
    assert store.list() == {"parts/readme.txt": 8}


def test_a_tokenizer_changed_in_the_store_is_refused_and_not_kept_on_the_node(store, tokenizer, download_cache):
    from niels_gpt.builders.tasks import _tokenizer
    from niels_gpt.errors import TokenizerError

    url = upload_tokenizer(store, tokenizer.model_path, tokenizer.sha256, {})
    fake = "f" * 64  # the folder a tokenizer of another sha256 would have: this model is not it
    store.put_bytes(f"tokenizer/{fake}/spm.model", store.get_bytes(f"tokenizer/{tokenizer.sha256}/spm.model"))
    with pytest.raises(TokenizerError, match=rf"spm.model: the copy fetched on .* has sha256 {tokenizer.sha256[:16]}"):
        _tokenizer(url.replace(tokenizer.sha256, fake), fake, {})
    assert not list(download_cache.rglob(fake))  # removed from the node: fetched again next time
    assert _tokenizer(url, tokenizer.sha256, {}).sha256 == tokenizer.sha256


def test_a_slow_read_of_a_part_that_keeps_moving_is_never_cut(s3, s3_endpoint, monkeypatch):
    import fsspec
    import s3fs

    from ..test_bad_input_catalogue_store_build import StallingProxy

    _, bucket = s3
    proxy = StallingProxy(s3_endpoint)
    monkeypatch.setitem(fsspec.config.conf, "s3", {**fsspec.config.conf["s3"], "endpoint_url": proxy.url})
    s3fs.S3FileSystem.clear_instance_cache()
    configure(timeout_s=0.5)
    try:
        store = WorkStore(f"{bucket}/w")
        data = bytes(range(256)) * 96  # 24 KiB: about 2 s at the proxy's pace, four times the limit
        store.put_bytes("parts/00000-0123456789ab.bin", data)
        proxy.slow = True
        t0 = time.monotonic()
        assert store.get_bytes("parts/00000-0123456789ab.bin") == data
        assert time.monotonic() - t0 > 1.0 and proxy.slowed == 1  # longer than the limit, in one attempt
    finally:
        reset()
        proxy.close()
        s3fs.S3FileSystem.clear_instance_cache()


def test_the_cleanup_of_thousands_of_parts_in_a_store_deletes_in_bulk(s3, s3_endpoint, monkeypatch):
    import fsspec
    import s3fs

    from ..test_bad_input_catalogue_store_build import StallingProxy

    fs, bucket = s3
    ours = {f"parts/{k:05d}-0123456789ab{suffix}": b"x" for k in range(600) for suffix in (".bin", ".json")}
    fs.pipe({f"{bucket[5:]}/w/{rel}": data for rel, data in {**ours, "plan.json": b"{}", "notes.txt": b"mine"}.items()})
    proxy = StallingProxy(s3_endpoint)
    monkeypatch.setitem(fsspec.config.conf, "s3", {**fsspec.config.conf["s3"], "endpoint_url": proxy.url})
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        remove_work_url(WorkStore(f"{bucket}/w"))
        # 1,201 objects: receipts (600), then parts (600), then the plan: a bulk request each, none one by one
        assert proxy.methods["DELETE"] == 0 and proxy.methods["POST"] <= 3
    finally:
        proxy.close()
        s3fs.S3FileSystem.clear_instance_cache()
    fs.invalidate_cache()
    assert [k.rsplit("/", 1)[-1] for k in fs.find(f"{bucket[5:]}/w")] == ["notes.txt"]


def test_a_resumed_commit_reads_the_parts_in_a_store_ahead_and_builds_the_same_cache(s3, s3_endpoint, monkeypatch,
                                                                                      tmp_path, tokenizer):
    import shutil

    import fsspec
    import s3fs

    from niels_gpt.cli import main

    from ..test_bad_input_catalogue_store_build import StallingProxy, _corpus

    _, bucket = s3
    proxy = StallingProxy(s3_endpoint)
    monkeypatch.setitem(fsspec.config.conf, "s3", {**fsspec.config.conf["s3"], "endpoint_url": proxy.url})
    s3fs.S3FileSystem.clear_instance_cache()
    out = tmp_path / "out"
    argv = ["build", str(_corpus(tmp_path)), "--out", str(out), "--tokenizer", tokenizer.model_path,
            "--executor", "processes", "--workers", "1", "--task-bytes", "20KB", "--work-dir", f"{bucket}/work", "--keep-parts",
            "--no-progress"]
    try:
        assert main(argv) == 0
        first = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
        shutil.rmtree(out)  # the rerun reuses every receipt: the commit alone reads the parts
        proxy.busiest, proxy.delay = 0, 0.2  # each read of a part answered 0.2 s late
        assert main(argv) == 0
        # one part at a time, the commit waited each answer in turn; now several are read at once
        assert proxy.busiest >= 4, proxy.busiest
        assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == first
    finally:
        proxy.close()
        s3fs.S3FileSystem.clear_instance_cache()
