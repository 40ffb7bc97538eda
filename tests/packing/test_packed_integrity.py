"""Packed bins check themselves: a rewrite is built aside and leaves the old pack whole until it is complete,
every array's sha256 is recorded and checked by verify, and a corrupt seq_starts is refused on open (not in collate)."""

import json

import numpy as np
import pytest

from niels_gpt.errors import FormatError
from niels_gpt.packing import PackedMemmapDataset, memmap_format, open_packed, pack_sft
from niels_gpt.report import verify_path

from ..conftest import SPECIALS, write_sft_cache


@pytest.fixture
def sft(tmp_path):
    a, e, u = SPECIALS["asst"], SPECIALS["eot"], SPECIALS["usr"]
    rows = [[u, 7 + i, 8, a, 9, 10 + i % 5, e][: 4 + i % 4] + [e] for i in range(40)]
    return write_sft_cache(tmp_path / "sft", rows)


def test_a_repack_killed_between_renames_keeps_the_old_pack_whole(sft, tmp_path, monkeypatch):
    out = tmp_path / "packed"
    pack_sft(str(sft), str(out), pack_size=32, algorithm="bfd")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    calls = []
    real = memmap_format.commit

    def dies_after_two(src, dst):
        if len(calls) == 2:
            raise KeyboardInterrupt("killed")  # stands for the kill: the process stops between two renames
        calls.append(dst)
        real(src, dst)

    monkeypatch.setattr(memmap_format, "commit", dies_after_two)
    with pytest.raises(KeyboardInterrupt):
        pack_sft(str(sft), str(out), pack_size=32, algorithm="ffd")
    assert len(calls) == 2  # two arrays of the new packing were renamed, aside, in its staging directory
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["packed", "sft"]
    assert verify_path(str(out)) == ([], 1)
    open_packed(out).validate()


def test_every_array_is_checksummed_and_a_changed_token_is_caught(sft, tmp_path):
    out = tmp_path / "packed"
    pack_sft(str(sft), str(out), pack_size=32)
    manifest = json.loads((out / "manifest.json").read_text())
    assert all(len(manifest["files"][n]["sha256"]) == 64 for n in memmap_format.ARRAYS)
    assert verify_path(str(out)) == ([], 1)
    ids = np.load(out / "input_ids.npy", mmap_mode="r+")
    ids[0, 1] += 1  # a payload byte: every structural check still passes
    ids.flush()
    del ids
    problems, _ = verify_path(str(out))
    assert len(problems) == 1 and "input_ids.npy: sha256 differs from manifest.json" in problems[0]


@pytest.mark.parametrize("value", [2**32 - 1, 0, 99])
def test_a_corrupt_seq_starts_is_refused_when_the_dataset_opens(sft, tmp_path, value):
    out = tmp_path / "packed"
    pack_sft(str(sft), str(out), pack_size=32)
    starts = np.load(out / "seq_starts.npy", mmap_mode="r+")
    starts[1] = value  # the second sequence of bin 0: wrapped, a repeat of 0, past the bin
    starts.flush()
    del starts
    with pytest.raises(FormatError, match=r"seq_starts.npy: sequence 1 \(bin 0\) starts at"):
        PackedMemmapDataset(out)
