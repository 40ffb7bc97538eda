"""memmap_padded_v1 writer and the checks its reader runs on open."""

import json
import tracemalloc

import numpy as np
import pytest

from niels_gpt.constants import MANIFEST_NAME
from niels_gpt.errors import ConfigError, FormatError, IncompleteCacheError
from niels_gpt.packing.dataset import PackedMemmapDataset
from niels_gpt.packing.memmap_format import ARRAYS, MemmapShardWriter, read_manifest
from niels_gpt.seals import sealed_bytes

BINS = [
    (np.array([1, 2, 3]), np.array([0, 1, 0]), np.array([0])),
    (np.array([4, 5, 6, 7]), np.array([0, 1, 0, 0]), np.array([0, 2])),
    (np.array([8, 9]), np.array([0, 0]), np.array([0, 1])),
]


def _write(path, bins=BINS, pack_size=10):
    with MemmapShardWriter(path, len(bins), pack_size, sum(len(s) for _, _, s in bins)) as w:
        for ids, mask, starts in bins:
            w.write_bin(ids, mask, starts)
        return w.finalize(algorithm="hand")


def test_round_trip(tmp_path):
    manifest = _write(tmp_path / "s")
    ds = PackedMemmapDataset(tmp_path / "s")
    assert len(ds) == 3
    for i, (ids, mask, starts) in enumerate(BINS):
        item = ds[i]
        assert item["input_ids"].dtype == np.int32 and item["input_ids"].tolist() == ids.tolist()
        assert item["loss_mask"].tolist() == mask.tolist()
        assert item["seq_boundaries"].tolist() == starts.tolist() + [len(ids)]
    raw = np.load(tmp_path / "s" / "input_ids.npy")
    assert raw.shape == (3, 10) and raw.dtype == np.dtype("<i4")
    assert raw[0].tolist() == [1, 2, 3, 0, 0, 0, 0, 0, 0, 0]
    assert np.load(tmp_path / "s" / "seq_offsets.npy").tolist() == [0, 1, 3, 5]
    assert np.load(tmp_path / "s" / "seq_starts.npy").tolist() == [0, 0, 2, 0, 1]
    assert np.load(tmp_path / "s" / "packed_len.npy").tolist() == [3, 4, 2]
    assert manifest["format"] == "memmap_padded_v1" and manifest["version"] == 1
    assert manifest["num_tokens"] == 9 and manifest["efficiency"] == pytest.approx(9 / 30)
    from niels_gpt.cache.meta import sha256_file

    plen_path = tmp_path / "s" / "packed_len.npy"
    assert manifest["files"]["packed_len"] == {"name": "packed_len.npy", "dtype": "<u4", "shape": [3],
                                               "bytes": plen_path.stat().st_size, "sha256": sha256_file(str(plen_path))}
    assert manifest["loss_mask_convention"] == "shift_left_within_sequence"
    assert json.loads((tmp_path / "s" / MANIFEST_NAME).read_text()) == manifest
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == sorted([f"{a}.npy" for a in ARRAYS] + [MANIFEST_NAME])


def test_peak_traced_memory_under_100mb_for_10000_bins_of_2048(tmp_path):
    ids = np.arange(2000, dtype=np.int32)
    mask = (ids % 2).astype(np.uint8)
    starts = np.array([0, 500, 1000, 1500], dtype=np.uint32)
    tracemalloc.start()
    try:
        with MemmapShardWriter(tmp_path / "big", 10_000, 2048, 40_000) as w:
            for i in range(10_000):
                ids[0] = i
                w.write_bin(ids, mask, starts)
            w.finalize()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 100 * 2**20, f"peak {peak / 2**20:.1f} MiB"
    ds = PackedMemmapDataset(tmp_path / "big")
    assert ds[9_999]["input_ids"][:2].tolist() == [9_999, 1]


def test_interrupted_write_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        with MemmapShardWriter(tmp_path / "s", 2, 8, 2) as w:
            w.write_bin([1, 2], [0, 1], [0])
            raise RuntimeError("killed")
    assert list((tmp_path / "s").iterdir()) == []


def test_finalize_refuses_an_incomplete_shard(tmp_path):
    w = MemmapShardWriter(tmp_path / "s", 2, 8, 2)
    w.write_bin([1, 2], [0, 1], [0])
    with pytest.raises(ConfigError, match="wrote 1/2 bins"):
        w.finalize()
    assert list((tmp_path / "s").iterdir()) == []


@pytest.mark.parametrize("ids,mask,starts,match", [
    ([1] * 9, [0] * 9, [0], "9 tokens and 9 mask values; need equal lengths in 1..8"),
    ([1, 2], [0], [0], "2 tokens and 1 mask values"),
    ([1, 2, 3], [0, 0, 0], [1], "seq_starts must begin with 0"),
    ([1, 2, 3], [0, 0, 0], [0, 2, 2], "must strictly increase"),
    ([1, 2, 3], [0, 0, 0], [0, 3], "seq_start 3 is not below packed_len 3"),
])
def test_write_bin_rejects_bad_bins(tmp_path, ids, mask, starts, match):
    with pytest.raises((ConfigError, FormatError), match=match):
        with MemmapShardWriter(tmp_path / "s", 1, 8, 3) as w:
            w.write_bin(ids, mask, starts)


def test_write_bin_rejects_more_bins_than_sized(tmp_path):
    with pytest.raises(ConfigError, match="sized for 1 bins"):
        with MemmapShardWriter(tmp_path / "s", 1, 8, 2) as w:
            w.write_bin([1], [0], [0])
            w.write_bin([1], [0], [0])


def _edit_manifest(path, **changes):
    m = json.loads((path / MANIFEST_NAME).read_text())
    for key, value in changes.items():
        if "." in key:
            a, b, c = key.split(".")
            m[a][b][c] = value
        else:
            m[key] = value
    (path / MANIFEST_NAME).write_bytes(sealed_bytes(m))  # sealed: the field checks below it are tested


def test_missing_manifest_means_incomplete(tmp_path):
    _write(tmp_path / "s")
    (tmp_path / "s" / MANIFEST_NAME).unlink()
    with pytest.raises(IncompleteCacheError, match="no manifest.json in .*re-run `pack-sft`"):
        PackedMemmapDataset(tmp_path / "s")


def test_rejects_manifest_that_is_not_json(tmp_path):
    _write(tmp_path / "s")
    (tmp_path / "s" / MANIFEST_NAME).write_text("{oops")
    with pytest.raises(FormatError, match="not valid JSON"):
        read_manifest(tmp_path / "s")


@pytest.mark.parametrize("changes,match", [
    ({"format": "memmap_padded_v2"}, "format 'memmap_padded_v2', expected 'memmap_padded_v1'"),
    ({"version": 2}, "version 2 is not supported"),
    ({"loss_mask_convention": "roll_right"}, "loss_mask_convention 'roll_right'"),
    ({"num_bins": -1}, "num_bins must be a non-negative integer"),
    ({"pack_size": "10"}, "pack_size must be a non-negative integer"),
    ({"files.input_ids.dtype": ">i4"}, "files.input_ids.dtype is '>i4', expected '<i4'"),
    ({"files.input_ids.name": "../input_ids.npy"}, "files.input_ids.name '../input_ids.npy' is not a plain"),
    ({"files.loss_mask.name": "/etc/passwd.npy"}, "files.loss_mask.name '/etc/passwd.npy'"),
    ({"files.seq_starts.name": "sub/seq_starts.npy"}, "files.seq_starts.name 'sub/seq_starts.npy'"),
    ({"files.seq_starts.name": ".."}, "files.seq_starts.name '..'"),
    ({"files.packed_len.name": "packed_len.txt"}, "files.packed_len.name 'packed_len.txt'"),
])
def test_rejects_bad_manifests(tmp_path, changes, match):
    _write(tmp_path / "s")
    _edit_manifest(tmp_path / "s", **changes)
    with pytest.raises(FormatError, match=match):
        PackedMemmapDataset(tmp_path / "s")


def test_rejects_manifest_missing_fields(tmp_path):
    _write(tmp_path / "s")
    m = json.loads((tmp_path / "s" / MANIFEST_NAME).read_text())
    del m["num_sequences"], m["files"]
    (tmp_path / "s" / MANIFEST_NAME).write_text(json.dumps(m))
    with pytest.raises(FormatError, match="missing field\\(s\\) num_sequences, files"):
        read_manifest(tmp_path / "s")


def test_rejects_array_shape_that_disagrees_with_manifest(tmp_path):
    _write(tmp_path / "s")
    np.save(tmp_path / "s" / "input_ids.npy", np.zeros((3, 11), dtype="<i4"))
    with pytest.raises(FormatError, match=r"input_ids.npy: shape \(3, 11\) disagrees with the manifest's \(3, 10\)"):
        PackedMemmapDataset(tmp_path / "s")


def test_rejects_wrong_count_in_manifest(tmp_path):
    _write(tmp_path / "s")
    _edit_manifest(tmp_path / "s", num_sequences=6)
    with pytest.raises(FormatError, match=r"seq_starts.npy: shape \(5,\) disagrees with the manifest's \(6,\)"):
        PackedMemmapDataset(tmp_path / "s")


def test_rejects_big_endian_array(tmp_path):
    _write(tmp_path / "s")
    np.save(tmp_path / "s" / "packed_len.npy", np.array([3, 4, 2], dtype=">u4"))
    with pytest.raises(FormatError, match="packed_len.npy: dtype >u4 .*expected C-order <u4"):
        PackedMemmapDataset(tmp_path / "s")


def test_rejects_truncated_array(tmp_path):
    _write(tmp_path / "s")
    path = tmp_path / "s" / "loss_mask.npy"
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(FormatError, match="loss_mask.npy: .* bytes, expected .*truncated"):
        PackedMemmapDataset(tmp_path / "s")


def test_rejects_missing_array(tmp_path):
    _write(tmp_path / "s")
    (tmp_path / "s" / "seq_starts.npy").unlink()
    with pytest.raises(FormatError, match="seq_starts.npy: missing"):
        PackedMemmapDataset(tmp_path / "s")


def test_rejects_inconsistent_offsets_and_lengths(tmp_path):
    _write(tmp_path / "s")
    np.save(tmp_path / "s" / "seq_offsets.npy", np.array([0, 2, 1, 5], dtype="<u4"))
    with pytest.raises(FormatError, match="seq_offsets.npy: must start at 0, increase"):
        PackedMemmapDataset(tmp_path / "s")
    _write(tmp_path / "t")
    np.save(tmp_path / "t" / "packed_len.npy", np.array([3, 11, 2], dtype="<u4"))
    with pytest.raises(FormatError, match="packed_len.npy: values must be in 1..10, found 2..11"):
        PackedMemmapDataset(tmp_path / "t")


def test_validate_catches_a_target_across_a_boundary(tmp_path):
    good = [(np.array([1, 2, 3, 4]), np.array([1, 0, 1, 0]), np.array([0, 2]))]
    _write(tmp_path / "s", good)
    PackedMemmapDataset(tmp_path / "s").validate()
    leaky = [(np.array([1, 2, 3, 4]), np.array([0, 1, 1, 0]), np.array([0, 2]))]
    _write(tmp_path / "t", leaky)
    with pytest.raises(FormatError, match="bin 0: loss_mask is 1 at a sequence's last position"):
        PackedMemmapDataset(tmp_path / "t").validate()


def test_empty_shard_round_trips(tmp_path):
    with MemmapShardWriter(tmp_path / "e", 0, 8, 0) as w:
        m = w.finalize()
    assert m["num_bins"] == 0 and m["efficiency"] == 1.0
    assert len(PackedMemmapDataset(tmp_path / "e")) == 0
