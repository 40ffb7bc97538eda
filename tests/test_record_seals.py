"""Every record an output carries checks itself (niels_gpt/seals.py): `verify` catches every single change to
a cache's or a tokenizer's meta.json, a packed manifest.json and a convert receipt, the fields no reader uses
included; readers refuse a changed record on open; a record written before records carried a seal still
opens, and `verify` says that its unread fields are not checked."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from niels_gpt.errors import CacheMismatchError
from niels_gpt.formats.convert import convert
from niels_gpt.formats.receipt import read_receipt
from niels_gpt.meta import read_meta
from niels_gpt.packing import PackedMemmapDataset
from niels_gpt.packing.pack import pack_sft
from niels_gpt.readers.pretrain import PretrainTokenStreamDataset
from niels_gpt.report import verify_outputs, verify_path
from niels_gpt.seals import RECORD_SEAL, written_form

from .conftest import write_pretrain_cache, write_sft_cache

RNG = np.random.default_rng(0)


def _chat(n: int) -> list[int]:
    # user: sentinel 5, content; assistant: sentinel 6, content, eot 3 (the library's sentinels of conftest)
    return [5, *RNG.integers(10, 2000, n).tolist(), 6, *RNG.integers(10, 2000, n).tolist(), 3]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory, tokenizer) -> dict[str, Path]:
    """One tiny output of each kind that carries a record of ours: {kind: its record file}."""
    root = tmp_path_factory.mktemp("sealed")
    pre = write_pretrain_cache(root / "pre", {"train": [np.arange(10, 300) % 1999 + 3], "val": [np.arange(10, 90)]})
    sft = write_sft_cache(root / "sft", [_chat(8) for _ in range(6)], [_chat(5)])
    tok = Path(shutil.copytree(Path(tokenizer.model_path).parent, root / "tokenizer"))
    pack_sft(sft, root / "packed", pack_size=64)
    convert(pre, root / "converted", to="nanogpt")
    return {"pretrain meta.json": pre / "meta.json", "sft meta.json": sft / "meta.json",
            "tokenizer meta.json": tok / "meta.json", "manifest.json": root / "packed" / "manifest.json",
            "niels_receipt.json": root / "converted" / "niels_receipt.json"}


def _single_changes(data: bytes):
    """One digit changed in each number (the campaign's digit edits), a byte dropped, a byte added, and the
    changes JSON does not see: a dropped final newline, a space added, an escaped character."""
    for m in re.finditer(rb"\d", data):
        p = m.start()
        yield f"digit @{p}", data[:p] + bytes([ord("0") + (data[p] - ord("0") + 1) % 10]) + data[p + 1:]
    yield "truncate", data[:-1]
    yield "extend", data + b"\0"
    yield "extra space", data.replace(b": ", b":  ", 1)
    yield "escaped letter", data.replace(b'"kind"', b'"\\u006bind"', 1) if b'"kind"' in data else \
        data.replace(b'"format"', b'"\\u0066ormat"', 1)


def _bump(data: bytes, field: bytes) -> bytes:
    """`data` with the last digit of the number after `"field": ` changed."""
    p = re.search(rb'"' + field + rb'": [0-9.]+', data).end() - 1
    return data[:p] + bytes([ord("0") + (data[p] - ord("0") + 1) % 10]) + data[p + 1:]


@pytest.mark.parametrize("kind", ["pretrain meta.json", "sft meta.json", "tokenizer meta.json", "manifest.json",
                                  "niels_receipt.json"])
def test_verify_catches_every_single_change_to_a_record(outputs, kind):
    record = outputs[kind]
    clean = record.read_bytes()
    assert RECORD_SEAL in json.loads(clean)
    # a packed directory holds its val split too (OUT/val/, a shard of its own): verify checks both
    assert verify_path(str(record.parent)) == ([], 2 if kind == "manifest.json" else 1)
    missed = []
    try:
        for what, changed in _single_changes(clean):
            record.write_bytes(changed)
            problems, _ = verify_path(str(record.parent))
            if not problems:
                missed.append(what)
    finally:
        record.write_bytes(clean)
    assert not missed, f"{len(missed)} change(s) of {record.name} passed verify: {missed[:10]}"


def test_an_edit_of_a_field_no_reader_uses_is_named_by_verify_and_refused_on_open(outputs):
    record = outputs["pretrain meta.json"]
    clean = record.read_bytes()
    try:
        record.write_bytes(_bump(clean, b"val_tokens"))
        problems, _ = verify_path(str(record.parent))
        assert len(problems) == 1 and "do not hash to its record_sha256" in problems[0], problems
        with pytest.raises(CacheMismatchError, match=r"meta.json: its fields do not hash to its record_sha256"):
            PretrainTokenStreamDataset(str(record.parent / "train"), T=8, device="cpu")
        record.write_bytes(clean[:-1])  # the fields are the same; the bytes are not what was written
        with pytest.raises(CacheMismatchError, match="bytes are not the form they were written in"):
            read_meta(str(record.parent))
    finally:
        record.write_bytes(clean)


def test_changed_manifest_and_receipt_are_refused_on_open(outputs):
    manifest, receipt = outputs["manifest.json"], outputs["niels_receipt.json"]
    clean_m, clean_r = manifest.read_bytes(), receipt.read_bytes()
    try:
        manifest.write_bytes(_bump(clean_m, b"efficiency"))  # a figure no reader uses
        with pytest.raises(CacheMismatchError, match=r"manifest.json: its fields do not hash.*re-run `pack-sft`"):
            PackedMemmapDataset(manifest.parent)
        receipt.write_bytes(clean_r.replace(b'"version": 1', b'"version": 1 '))
        with pytest.raises(CacheMismatchError, match=r"niels_receipt.json: its fields hold but its bytes"):
            read_receipt(receipt)
    finally:
        manifest.write_bytes(clean_m)
        receipt.write_bytes(clean_r)


def test_a_damaged_seal_name_is_not_taken_for_an_old_record(outputs):
    record = outputs["sft meta.json"]
    clean = record.read_bytes()
    try:
        record.write_bytes(clean.replace(b'"record_sha256"', b'"record_sha257"'))
        with pytest.raises(CacheMismatchError, match=r"its record_sha256 field is damaged \(read as 'record_sha257'\)"):
            read_meta(str(record.parent))
    finally:
        record.write_bytes(clean)


def test_a_record_written_before_seals_still_opens_and_verify_says_it_is_unchecked(outputs, tmp_path):
    old = Path(shutil.copytree(outputs["pretrain meta.json"].parent, tmp_path / "old"))
    meta = json.loads((old / "meta.json").read_bytes())
    del meta[RECORD_SEAL]
    (old / "meta.json").write_bytes(written_form(meta))  # what the writer wrote before records were sealed
    ds = PretrainTokenStreamDataset(str(old / "train"), T=8, device="cpu")
    assert ds.num_tokens == 290
    problems, checked, seen = verify_outputs(str(old))
    assert problems == [] and checked == 1
    assert "has no record_sha256: written by an older version, so fields no reader uses are not checked" in seen[0]
    meta["totals"]["val_tokens"] += 1  # an old record's unread fields are not checked: what verify said
    (old / "meta.json").write_bytes(written_form(meta))
    assert verify_path(str(old)) == ([], 1)
