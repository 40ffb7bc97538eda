"""Corrupted, truncated, lying and ambiguous files are refused with messages that say what and how."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from niels_gpt.cache.formats import detect_format
from niels_gpt.errors import ConfigError, FormatError
from niels_gpt.formats import megatron, nanogpt
from niels_gpt.formats.bos_index import read_sidecar
from niels_gpt.formats.convert import convert
from niels_gpt.formats.npy import open_npy
from niels_gpt.formats.raw import open_raw, write_raw


def _nanogpt(path, magic=278895051, version=1, count=2, itemsize=2, payload=b"\x01\x00\x02\x00", extra=()):
    header = np.zeros(256, dtype="<i4")
    header[:4] = [magic, version, count, itemsize]
    for i, v in extra:
        header[i] = v
    path.write_bytes(header.tobytes() + payload)
    return path


@pytest.mark.parametrize("kwargs, match", [
    ({"magic": 12345}, "magic 12345 is neither"),
    ({"version": 2}, "version 2, expected 1"),
    ({"count": -1}, "negative"),
    ({"itemsize": 3}, "bytes/token 3"),
    ({"magic": 20240520, "itemsize": 4}, "legacy shards are uint16"),
    ({"count": 5}, "truncated: the header's num_tokens promises 5 tokens"),
    ({"count": 1}, "2 bytes beyond the 1 tokens"),
    ({"extra": [(100, 7)]}, "header int32 #100 is 7, expected 0"),
])
def test_nanogpt_bad_headers_are_rejected(tmp_path, kwargs, match):
    path = _nanogpt(tmp_path / "x.bin", **kwargs)
    with pytest.raises(FormatError, match=match):
        nanogpt.read_header(path)


def test_nanogpt_truncated_header_is_rejected(tmp_path):
    (tmp_path / "x.bin").write_bytes(struct.pack("<4i", 278895051, 1, 0, 2))
    with pytest.raises(FormatError, match="truncated header: 16 of 1024 bytes"):
        nanogpt.read_header(tmp_path / "x.bin")


def test_detect_rejects_a_lying_nanogpt_header(tmp_path):
    _nanogpt(tmp_path / "x.bin", count=3)
    with pytest.raises(FormatError, match="x.bin: truncated"):
        detect_format(tmp_path)


def test_legacy_writer_refuses_uint32(tmp_path):
    with pytest.raises(ConfigError, match="legacy nanoGPT format .* holds only uint16"):
        nanogpt.NanogptSink(tmp_path / "x.bin", "uint32", legacy=True)


def test_writer_refuses_ids_that_do_not_fit(tmp_path):
    sink = nanogpt.NanogptSink(tmp_path / "x.bin", "uint16")
    with pytest.raises(FormatError, match="token id 65536 does not fit uint16"):
        sink.write(np.array([1, 65536]))
    sink.abort()
    assert list(tmp_path.iterdir()) == []


def test_npy_rejections(tmp_path):
    np.save(tmp_path / "f.npy", np.zeros(3, dtype=np.float32))
    with pytest.raises(FormatError, match="dtype <f4; token files must be"):
        open_npy(tmp_path / "f.npy")
    np.save(tmp_path / "m.npy", np.zeros((2, 2), dtype="<u2"))
    with pytest.raises(FormatError, match=r"shape \(2, 2\); token files must be 1-D"):
        open_npy(tmp_path / "m.npy")
    np.save(tmp_path / "b.npy", np.zeros(3, dtype=">u2"))
    with pytest.raises(FormatError, match="dtype >u2"):
        open_npy(tmp_path / "b.npy")
    np.save(tmp_path / "o.npy", np.array([1, "a"], dtype=object), allow_pickle=True)
    with pytest.raises(FormatError, match="object array"):
        open_npy(tmp_path / "o.npy")
    np.save(tmp_path / "t.npy", np.arange(10, dtype="<u2"))
    data = (tmp_path / "t.npy").read_bytes()
    (tmp_path / "t.npy").write_bytes(data[:-4])
    with pytest.raises(FormatError, match="truncated: the .npy header promises 10 tokens"):
        open_npy(tmp_path / "t.npy")
    (tmp_path / "g.npy").write_bytes(b"\x93NUMPY\x01\x00\x10\x00{'descr': garbage")
    with pytest.raises(FormatError, match="corrupt .npy header"):
        open_npy(tmp_path / "g.npy")


def test_headerless_bin_without_meta_is_not_guessed(tmp_path):
    write_raw(tmp_path / "shard_00000.bin", [1, 2, 3, 4], "uint16")  # 8 bytes: "divisible by 4"
    with pytest.raises(FormatError, match=r"pass the dtype \(--dtype uint16\|uint32"):
        detect_format(tmp_path)
    assert detect_format(tmp_path, "uint16").num_tokens == 4
    assert detect_format(tmp_path / "shard_00000.bin", dtype="uint32").num_tokens == 2


def test_raw_bin_of_partial_tokens_is_rejected(tmp_path):
    (tmp_path / "r.bin").write_bytes(b"\x01\x02\x03")
    with pytest.raises(FormatError, match="3 bytes is not a whole number of 2-byte tokens"):
        open_raw(tmp_path / "r.bin", "uint16")


def test_mixed_directory_is_rejected(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros(2, "<u2"))
    _nanogpt(tmp_path / "b.bin")
    with pytest.raises(FormatError, match="holds both .npy and .bin files"):
        detect_format(tmp_path)
    (tmp_path / "a.npy").unlink()
    write_raw(tmp_path / "c.bin", [1], "uint16")
    with pytest.raises(FormatError, match=r"mixes formats \['nanogpt', 'raw'\]"):
        detect_format(tmp_path, "uint16")


def test_missing_path_and_empty_directory(tmp_path):
    with pytest.raises(FormatError, match="no such file or directory"):
        detect_format(tmp_path / "nope")
    with pytest.raises(FormatError, match="no token files and no train/ or val/"):
        detect_format(tmp_path)


def _megatron_pair(tmp_path):
    w = megatron.MegatronWriter(tmp_path / "p", "uint16")
    for doc in ([1, 2, 6], [3, 6]):
        w.write(np.array(doc))
        w.end_document()
    w.close()
    return tmp_path / "p.idx", bytearray((tmp_path / "p.idx").read_bytes())


@pytest.mark.parametrize("edit, match", [
    (lambda b: b.__setitem__(slice(0, 9), b"NOTMAGIC!"), "magic .* expected"),
    (lambda b: b.__setitem__(slice(9, 17), struct.pack("<Q", 2)), "version 2, expected 1"),
    (lambda b: b.__setitem__(17, 7), "dtype code 7 is not an integer token type"),
    (lambda b: b.__setitem__(slice(18, 26), struct.pack("<Q", 5)), "counts lie"),
    (lambda b: b.__setitem__(slice(34 + 8 + 8, 34 + 8 + 16), struct.pack("<q", 4)), "sequence_pointers"),
    (lambda b: b.__setitem__(slice(len(b) - 8, len(b)), struct.pack("<q", 1)), "document_indices must rise"),
    (lambda b: b.__setitem__(slice(34, 38), struct.pack("<i", 4)), "sequence_pointers"),
])
def test_megatron_corrupt_index_is_rejected(tmp_path, edit, match):
    idx, data = _megatron_pair(tmp_path)
    edit(data)
    idx.write_bytes(bytes(data))
    with pytest.raises(FormatError, match=match):
        megatron.read_index(idx)


def test_megatron_truncated_index_and_bin(tmp_path):
    idx, data = _megatron_pair(tmp_path)
    idx.write_bytes(bytes(data[:-3]))
    with pytest.raises(FormatError, match="the index is truncated or its counts lie"):
        megatron.read_index(idx)
    idx.write_bytes(bytes(data[:20]))
    with pytest.raises(FormatError, match="truncated header: 20 of 34 bytes"):
        megatron.read_index(idx)
    idx.write_bytes(bytes(data))
    (tmp_path / "p.bin").write_bytes((tmp_path / "p.bin").read_bytes()[:-2])
    with pytest.raises(FormatError, match="p.bin: 8 bytes, but .* lists 10 bytes"):
        megatron.read_index(idx)
    (tmp_path / "p.bin").unlink()
    with pytest.raises(FormatError, match="p.bin: missing"):
        megatron.read_index(idx)


def test_stray_idx_without_magic_is_rejected(tmp_path):
    (tmp_path / "x.idx").write_bytes(b"garbage")
    with pytest.raises(FormatError, match="an .idx without the Megatron magic"):
        detect_format(tmp_path)


def test_truncated_sidecar_is_rejected(tmp_path):
    (tmp_path / "s.bos.idx").write_bytes(b"\x00\x00\x00")
    with pytest.raises(FormatError, match="not a whole number of int32 positions"):
        read_sidecar(tmp_path / "s.bos.idx")


def test_cache_shard_that_disagrees_with_meta_is_rejected(small_cache):
    shard = small_cache / "train" / "shard_00001.bin"
    shard.write_bytes(shard.read_bytes()[:-2])
    with pytest.raises(FormatError, match="shard_00001.bin: 6 bytes, .*meta.json says 8"):
        detect_format(small_cache)


def test_stray_shard_in_cache_is_rejected(small_cache):
    write_raw(small_cache / "val" / "shard_00007.bin", [1], "uint16")
    with pytest.raises(FormatError, match="not listed in .*meta.json"):
        detect_format(small_cache)


def test_a_folder_of_megatron_pairs_of_two_dtypes_is_refused(tmp_path):
    """As every other format: one dtype a folder (the second pair was read as the first pair's dtype)."""
    for prefix, dtype in (("a", "uint16"), ("b", "uint32")):
        w = megatron.MegatronWriter(tmp_path / prefix, dtype)
        w.write(np.array([1, 2, 6]))
        w.end_document()
        w.close()
    with pytest.raises(FormatError, match=r"files of different dtypes \['int32', 'uint16'\]"):
        detect_format(tmp_path)
    (tmp_path / "b.bin").unlink()
    (tmp_path / "b.idx").unlink()
    assert detect_format(tmp_path).num_tokens == 3


@pytest.mark.parametrize("fmt", ["megatron", "nanogpt"])
def test_a_dtype_given_for_files_that_record_theirs_is_said_to_be_ignored(tmp_path, fmt):
    # a format that records its dtype ignores a dtype given with a warning, Megatron pairs too (they said nothing)
    src = tmp_path / "src"
    src.mkdir()
    if fmt == "megatron":
        _megatron_pair(src)
    else:
        _nanogpt(src / "a.bin")
    info = detect_format(src, "uint32")
    assert info.warnings == [f"{src}: the dtype given (uint32) is ignored: the files record {info.dtype.name}"]
    # convert --src-dtype says so too (it said nothing)
    assert convert(src, tmp_path / "out", to="raw", src_dtype="uint32", eot_id=6)["notes"][0] == info.warnings[0]
