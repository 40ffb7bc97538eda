"""The download cache deletes only what it fetched: eviction counts and removes only files a mirror's marker
lists, and a directory that is not a download cache of this library is refused before anything is written."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from niels_gpt.errors import ConfigError
from niels_gpt.storage import RemoteCache, configure, upload_tree
from niels_gpt.storage.local_cache import OWN_MARK, claim, make_room

from ..conftest import write_pretrain_cache


def test_eviction_leaves_files_no_mirror_marker_lists(tmp_path):
    root = tmp_path / "dl"
    claim(root)
    mirror = root / "remote" / "0123456789abcdef"
    mirror.mkdir(parents=True)
    (mirror / "meta.json").write_text(json.dumps({"files": {"a.bin": {}, "b.bin": {}}}))
    for name in ("a.bin", "b.bin", "notes.txt"):
        (mirror / name).write_bytes(b"x" * 100)
    photos = root / "remote" / "photos"
    photos.mkdir()
    for i in range(3):
        (photos / f"p{i}.jpg").write_bytes(b"y" * 100)
    make_room(root, 50, 40, set())  # room for nothing: everything evictable goes
    assert sorted(os.listdir(mirror)) == ["meta.json", "notes.txt"]
    assert sorted(os.listdir(photos)) == ["p0.jpg", "p1.jpg", "p2.jpg"]


def test_a_fetched_tokenizer_counts_towards_the_bound_and_is_never_evicted(tmp_path):
    root = tmp_path / "dl"
    claim(root)
    tok = root / "remote" / "tokenizers" / ("ab" * 32)
    tok.mkdir(parents=True)
    (tok / "tokenizer.model").write_bytes(b"m" * 300)
    (tok / "meta.json").write_bytes(b"{}")
    mirror = root / "remote" / "0123456789abcdef"
    mirror.mkdir()
    (mirror / "meta.json").write_text(json.dumps({"files": {"a.bin": {}}}))
    (mirror / "a.bin").write_bytes(b"x" * 100)
    reserve = root / "remote" / "0123456789abcdef" / "b.bin.reserved.tmp-1"
    # 300 + 2 tokenizer bytes and the marker are held: 100 more fit under 450 only once a.bin is evicted
    make_room(root, 450, 100, set(), reserve=reserve)
    assert not (mirror / "a.bin").exists() and (tok / "tokenizer.model").is_file() and (tok / "meta.json").is_file()
    os.unlink(reserve)


def test_a_directory_with_someone_elses_files_is_refused_before_anything_is_written(tmp_path, download_cache):
    url = "memory://owns-refused/c"
    upload_tree(write_pretrain_cache(tmp_path / "c", {"train": [np.arange(300)], "val": [np.arange(50)]}), url)
    mine = tmp_path / "mine"
    (mine / "remote" / "photos").mkdir(parents=True)
    (mine / "remote" / "photos" / "a.jpg").write_bytes(b"jpg")
    configure(cache_dir=mine)
    with pytest.raises(ConfigError, match=r"--local-cache .*mine: a non-empty directory that is not a download cache"):
        RemoteCache(url)
    assert sorted(p.relative_to(mine).as_posix() for p in mine.rglob("*")) == ["remote", "remote/photos",
                                                                               "remote/photos/a.jpg"]
    configure(cache_dir=tmp_path / "new")  # a missing directory becomes one, marked as ours
    rc = RemoteCache(url)
    assert (tmp_path / "new" / OWN_MARK).is_file() and rc.fetch("train/shard_00000.bin").is_file()
    configure(cache_dir=tmp_path / "new")
    RemoteCache(url)  # and is accepted again


def test_a_download_cache_from_before_the_mark_is_still_one(tmp_path):
    root = tmp_path / "old"
    (root / "remote" / "0123456789abcdef").mkdir(parents=True)
    (root / "remote" / "sources").mkdir()
    (root / "remote" / "tokenizers" / ("ab" * 32)).mkdir(parents=True)  # a tokenizer fetched from a work store
    (root / "locks").mkdir()
    (root / "core").mkdir()  # the CORE evaluation bundle, kept in the default directory
    (root / ".lock").write_bytes(b"")
    claim(root)
    assert (root / OWN_MARK).is_file()
