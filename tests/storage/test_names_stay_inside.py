"""A name read from a record never reaches outside its directory: meta.json, manifest.json, a receipt, a pin
file and a plan each refuse a name with '..', an absolute path, a backslash or an empty component, in one
error naming the record and the field, before anything is read or written (niels_gpt/confine.py)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from niels_gpt.cache.cli import main
from niels_gpt.confine import name_problem
from niels_gpt.errors import CacheError, FormatError, StorageError
from niels_gpt.formats.receipt import RECEIPT_NAME, read_receipt, write_receipt
from niels_gpt.meta import file_record, write_meta
from niels_gpt.seals import sealed_bytes
from niels_gpt.storage import upload_tree
from niels_gpt.storage.local_cache import PINS, pinned
from niels_gpt.storage.mirror import records_of

from ..conftest import write_pretrain_cache

ESCAPE = "train/../../../../victim/notes.txt"


@pytest.mark.parametrize("name", [ESCAPE, "/etc/passwd", "train\\x.bin", "train//x.bin", "train/", "", "..",
                                  "./train/x.bin", "C:/x.bin", "train/x\x00.bin", 3])
def test_a_name_that_is_not_plain_and_relative_is_refused(name):
    assert name_problem(name) is not None


@pytest.mark.parametrize("name", ["train/shard_00000.bin", "meta.json", "train/shard_00000.bin.zst", "a..b.npy"])
def test_a_plain_relative_name_is_accepted(name):
    assert name_problem(name) is None


def _hostile_cache(root, victim_bytes: bytes):
    """A cache whose meta.json also lists ESCAPE, with a file of that size and sha256 beside it."""
    cache = write_pretrain_cache(root, {"train": [np.arange(600) % 2000], "val": [np.arange(100) % 2000]})
    meta = json.loads((cache / "meta.json").read_text())
    (cache / "payload").write_bytes(victim_bytes)
    meta["files"][ESCAPE] = file_record(cache / "payload", None)
    (cache / "payload").unlink()
    write_meta(str(cache), meta)
    return cache


@pytest.mark.parametrize("command", ["verify", "stats", "inspect"])
def test_a_cache_url_naming_a_file_outside_the_download_cache_writes_nothing_there(command, s3, tmp_path,
                                                                                   download_cache, capsys):
    fs, bucket = s3
    victim = tmp_path / "victim" / "notes.txt"  # where ESCAPE lands from <download cache>/remote/<mirror>/
    victim.parent.mkdir()
    victim.write_bytes(b"the user's own notes\n")
    cache = _hostile_cache(tmp_path / "c", b"the server's bytes\n")
    upload_tree(cache, f"{bucket}/c")
    fs.pipe(f"{bucket[5:]}/c/{ESCAPE}", b"the server's bytes\n")
    status = main([command, f"{bucket}/c"])
    err = capsys.readouterr().err
    assert victim.read_bytes() == b"the user's own notes\n"
    assert status == 1, err
    line = [x for x in err.splitlines() if x.strip()][-1]
    assert line.startswith("error: ") and f"{bucket}/c/meta.json" in line and "files" in line
    assert ESCAPE in line and "not a plain relative name" in line
    assert not list(download_cache.rglob("*.tmp-*"))


def test_a_local_cache_whose_meta_names_a_file_outside_it_is_refused(tmp_path, capsys):
    cache = _hostile_cache(tmp_path / "c", b"x")
    assert main(["verify", str(cache)]) == 1
    [line] = [x for x in capsys.readouterr().out.splitlines() if x.startswith("MISMATCH")]
    assert str(cache / "meta.json") in line and "files" in line and ESCAPE in line


def test_a_packed_manifest_at_a_url_naming_a_path_is_refused():
    doc = {"files": {"input_ids": {"name": "../input_ids.npy", "bytes": 8, "sha256": "0" * 64}}}
    with pytest.raises(CacheError, match=r"s3://b/p/manifest.json: files.input_ids.name '../input_ids.npy' is not"):
        records_of(doc, "manifest.json", "s3://b/p")


def test_a_receipt_naming_a_file_outside_its_output_is_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.bin").write_bytes(b"abc")
    write_receipt(out, "nanogpt")
    doc = json.loads((out / RECEIPT_NAME).read_text())
    doc.pop("record_sha256")
    doc["files"]["sub//../../a.bin"] = doc["files"].pop("a.bin")
    (out / RECEIPT_NAME).write_bytes(sealed_bytes(doc))
    with pytest.raises(FormatError, match=r"niels_receipt.json: files 'sub//../../a.bin' is not a plain relative"):
        read_receipt(out / RECEIPT_NAME)


def test_a_pin_file_naming_a_file_outside_the_mirrors_is_refused(tmp_path):
    root = tmp_path / "dl"
    (root / PINS).mkdir(parents=True)
    pin = root / PINS / f"{os.getppid()}-999.txt"  # another live process's: its own pins are in memory
    pin.write_text(f"{root}/remote/abc/train/x.bin\n/home/someone/photos/a.jpg\n")
    with pytest.raises(StorageError, match=r"-999.txt: line 2 '/home/someone/photos/a.jpg' is not a plain"):
        pinned(root)
    pin.write_text(f"{root}/remote/abc/../../../x\n")
    with pytest.raises(StorageError, match="line 1"):
        pinned(root)
    pin.write_text(f"{root}/remote/abc/train/x.bin\n")
    assert f"{root}/remote/abc/train/x.bin" in pinned(root)


def test_an_output_in_a_store_whose_record_names_a_file_outside_its_prefix_is_not_replaced():
    import fsspec

    from niels_gpt.errors import ConfigError
    from niels_gpt.storage import staged_output

    fs = fsspec.filesystem("memory")
    fs.pipe("/names-out/other/keep.bin", b"keep")
    fs.pipe("/names-out/out/meta.json", json.dumps({"files": {"../other/keep.bin": {}}}).encode())
    with pytest.raises(ConfigError, match=r"memory://names-out/out/meta.json: files '../other/keep.bin' is not a"):
        with staged_output("memory://names-out/out", guard=True) as stage:
            (stage / "meta.json").write_text("{}")
    assert fs.cat_file("/names-out/other/keep.bin") == b"keep"
    assert fs.cat_file("/names-out/out/meta.json") == json.dumps({"files": {"../other/keep.bin": {}}}).encode()
