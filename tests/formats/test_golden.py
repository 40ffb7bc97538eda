"""Every header and sidecar we write, asserted byte for byte against files built by hand here."""

from __future__ import annotations

import struct

import numpy as np

from niels_gpt.formats import megatron, nanogpt
from niels_gpt.formats.base import RollingWriter
from niels_gpt.formats.bos_index import write_bos_index
from niels_gpt.formats.npy import NpySink, open_npy
from niels_gpt.formats.raw import write_raw


def _nanogpt_golden(magic: int, count: int, itemsize_field: int, payload: bytes) -> bytes:
    return struct.pack("<4i", magic, 1, count, itemsize_field) + b"\0" * (1024 - 16) + payload


def test_new_nanogpt_header_uint16_bytes(tmp_path):
    sink = nanogpt.NanogptSink(tmp_path / "a.bin", "uint16")
    sink.write(np.array([1, 2, 65535]))
    sink.close()
    assert (tmp_path / "a.bin").read_bytes() == _nanogpt_golden(278895051, 3, 2, struct.pack("<3H", 1, 2, 65535))


def test_new_nanogpt_header_uint32_bytes(tmp_path):
    sink = nanogpt.NanogptSink(tmp_path / "a.bin", "uint32")
    sink.write(np.array([70000, 5]))
    sink.close()
    assert (tmp_path / "a.bin").read_bytes() == _nanogpt_golden(278895051, 2, 4, struct.pack("<2I", 70000, 5))


def test_legacy_nanogpt_header_bytes(tmp_path):
    sink = nanogpt.NanogptSink(tmp_path / "a.bin", "uint16", legacy=True)
    sink.write(np.array([7, 8]))
    sink.close()
    assert (tmp_path / "a.bin").read_bytes() == _nanogpt_golden(20240520, 2, 0, struct.pack("<2H", 7, 8))


def test_nanogpt_reader_reads_hand_built_files(tmp_path):
    (tmp_path / "n.bin").write_bytes(_nanogpt_golden(278895051, 2, 4, struct.pack("<2I", 70000, 5)))
    (tmp_path / "l.bin").write_bytes(_nanogpt_golden(20240520, 3, 0, struct.pack("<3H", 1, 2, 3)))
    assert nanogpt.open_nanogpt(tmp_path / "n.bin").open().tolist() == [70000, 5]
    assert nanogpt.open_nanogpt(tmp_path / "l.bin").open().tolist() == [1, 2, 3]
    assert nanogpt.read_header(tmp_path / "l.bin").legacy


def test_bos_index_sidecar_is_int32_token_indices(tmp_path):
    sink = nanogpt.NanogptSink(tmp_path / "s.bin", "uint16", bos_id=9)
    sink.write(np.array([9, 1, 2]))
    sink.write(np.array([9, 3, 9]))
    rec = sink.close()
    assert rec["bos_index"] == str(tmp_path / "s.bos.idx")
    assert (tmp_path / "s.bos.idx").read_bytes() == struct.pack("<3i", 0, 3, 5)
    write_bos_index(tmp_path / "t.bin", np.array([], dtype=np.int64))
    assert (tmp_path / "t.bos.idx").read_bytes() == b""


def test_nanogpt_writer_rolls_over_at_max_tokens(tmp_path):
    roll = RollingWriter(lambda i: nanogpt.NanogptSink(tmp_path / nanogpt.shard_name("x", i), "uint16"), 2)
    roll.write(np.array([1, 2, 3]))
    roll.write(np.array([4, 5]))
    recs = roll.close()
    assert [r["tokens"] for r in recs] == [2, 2, 1]
    assert (tmp_path / "x_000002.bin").read_bytes() == _nanogpt_golden(278895051, 1, 2, struct.pack("<H", 5))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x_000000.bin", "x_000001.bin", "x_000002.bin"]


def test_npy_writer_equals_np_save_bytes(tmp_path):
    for dtype, values in (("<u2", [1, 2, 65535]), ("<u4", [0, 70000, 2**32 - 1])):
        sink = NpySink(tmp_path / f"a{dtype[-1]}.npy", dtype)
        sink.write(np.array(values[:1]))
        sink.write(np.array(values[1:]))
        sink.close()
        np.save(tmp_path / "ref.npy", np.array(values, dtype=dtype))
        assert (tmp_path / f"a{dtype[-1]}.npy").read_bytes() == (tmp_path / "ref.npy").read_bytes()
        assert open_npy(tmp_path / f"a{dtype[-1]}.npy").open().tolist() == values


def test_npy_header_is_hand_built_layout(tmp_path):
    sink = NpySink(tmp_path / "a.npy", "<u2")
    sink.write(np.array([5]))
    sink.close()
    text = b"{'descr': '<u2', 'fortran_order': False, 'shape': (1,), }"
    head = b"\x93NUMPY\x01\x00" + struct.pack("<H", 118) + text + b" " * (117 - len(text)) + b"\n"
    assert (tmp_path / "a.npy").read_bytes() == head + struct.pack("<H", 5)


def test_raw_bin_is_bare_little_endian(tmp_path):
    write_raw(tmp_path / "r.bin", [1, 258], "uint16")
    write_raw(tmp_path / "q.bin", [70000], "uint32")
    assert (tmp_path / "r.bin").read_bytes() == b"\x01\x00\x02\x01"
    assert (tmp_path / "q.bin").read_bytes() == struct.pack("<I", 70000)


def _megatron_golden_idx(code: int, lengths: list[int], itemsize: int) -> bytes:
    n = len(lengths)
    ptrs = (np.cumsum([0] + lengths)[:-1] * itemsize).astype(np.int64)
    return (b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + bytes([code]) + struct.pack("<QQ", n, n + 1)
            + struct.pack(f"<{n}i", *lengths) + struct.pack(f"<{n}q", *ptrs.tolist())
            + struct.pack(f"<{n + 1}q", *range(n + 1)))


def test_megatron_uint16_pair_bytes(tmp_path):
    w = megatron.MegatronWriter(tmp_path / "p", "uint16")
    for doc in ([1, 2, 6], [6], [3, 4, 5, 6]):
        w.write(np.array(doc))
        w.end_document()
    w.close()
    assert (tmp_path / "p.idx").read_bytes() == _megatron_golden_idx(8, [3, 1, 4], 2)
    assert (tmp_path / "p.bin").read_bytes() == struct.pack("<8H", 1, 2, 6, 6, 3, 4, 5, 6)
    index = megatron.read_index(tmp_path / "p")
    assert index.document_bounds().tolist() == [0, 3, 4, 8]


def test_megatron_uint32_corpus_is_int32_code_4(tmp_path):
    w = megatron.MegatronWriter(tmp_path / "p", "uint32")
    w.write(np.array([70000, 6]))
    w.end_document()
    w.close()
    assert (tmp_path / "p.idx").read_bytes() == _megatron_golden_idx(4, [2], 4)
    assert (tmp_path / "p.bin").read_bytes() == struct.pack("<2i", 70000, 6)


def test_megatron_empty_dataset_bytes(tmp_path):
    megatron.MegatronWriter(tmp_path / "e", "uint16").close()
    assert (tmp_path / "e.idx").read_bytes() == _megatron_golden_idx(8, [], 2)
    assert megatron.read_index(tmp_path / "e").num_tokens == 0
