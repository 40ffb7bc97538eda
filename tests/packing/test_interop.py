"""Packed Parquet (Megatron-Bridge / Nemotron) and the legacy pickled .npy: read, write, convert."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from niels_gpt.cache.cli import main
from niels_gpt.errors import ConfigError, FormatError, IncompleteCacheError
from niels_gpt.packing import (
    LegacyPackedDataset,
    PackedMemmapDataset,
    PackedParquetDataset,
    collate_packed,
    convert_legacy_to_memmap,
    convert_to_memmap,
    open_packed,
    pack_sft,
    write_packed_parquet,
)
from niels_gpt.packing.legacy import LegacyPickleWarning
from niels_gpt.report import verify_outputs

from ..conftest import write_sft_cache
from .helpers import chats

ROWS = [
    {"input_ids": [1, 2, 3, 4], "loss_mask": [0, 1, 0, 1], "seq_start_id": [0, 2]},
    {"input_ids": [5, 6], "loss_mask": [1, 0], "seq_start_id": [0]},
    {"input_ids": [7, 8, 9], "loss_mask": [0, 0, 0], "seq_start_id": [0, 1, 2]},
]


def _same_items(a, b):
    assert len(a) == len(b)
    for i in range(len(a)):
        x, y = a[i], b[i]
        for key in ("input_ids", "loss_mask", "seq_boundaries"):
            assert np.asarray(x[key]).tolist() == np.asarray(y[key]).tolist(), (i, key)


@pytest.fixture
def shard(tmp_path):
    write_sft_cache(tmp_path / "c", chats(60, seed=4))
    pack_sft(tmp_path / "c", tmp_path / "p", pack_size=160)
    return tmp_path / "p"


def test_memmap_to_parquet_and_back(tmp_path, shard):
    ds = PackedMemmapDataset(shard)
    n = write_packed_parquet(ds, tmp_path / "packed.idx.parquet", row_group_size=4)
    assert n == len(ds)
    table = pq.read_table(tmp_path / "packed.idx.parquet")
    assert table.schema.field("input_ids").type == pa.list_(pa.int32())
    assert table.schema.field("loss_mask").type == pa.list_(pa.uint8())
    assert table.schema.field("seq_start_id").type == pa.list_(pa.int32())
    assert pq.ParquetFile(tmp_path / "packed.idx.parquet").metadata.num_row_groups == -(-n // 4)
    pds = PackedParquetDataset(tmp_path / "packed.idx.parquet")
    _same_items(ds, pds)
    convert_to_memmap(pds, tmp_path / "back", pack_size=160, algorithm="converted")
    for name in ("input_ids.npy", "loss_mask.npy", "seq_starts.npy", "seq_offsets.npy", "packed_len.npy"):
        assert (tmp_path / "back" / name).read_bytes() == (shard / name).read_bytes()


def test_reads_what_megatron_bridge_writes(tmp_path):
    # Megatron-Bridge's write_packed_parquet: inferred list<int64> ids/starts, list<int8> mask
    table = pa.table({"input_ids": [r["input_ids"] for r in ROWS],
                      "loss_mask": pa.array([r["loss_mask"] for r in ROWS], type=pa.list_(pa.int8())),
                      "seq_start_id": [r["seq_start_id"] for r in ROWS]})
    pq.write_table(table, tmp_path / "mb.parquet", row_group_size=2)
    ds = open_packed(tmp_path / "mb.parquet")
    assert isinstance(ds, PackedParquetDataset) and len(ds) == 3
    assert ds[0]["input_ids"].dtype == np.int32 and ds[0]["seq_boundaries"].tolist() == [0, 2, 4]
    assert ds[2]["loss_mask"].tolist() == [0, 0, 0] and ds[1]["input_ids"].tolist() == [5, 6]


def test_directory_of_parquet_files_reads_in_name_order(tmp_path):
    d = tmp_path / "dir"
    d.mkdir()
    for name, rows in (("b.parquet", ROWS[1:]), ("a.parquet", ROWS[:1])):
        pq.write_table(pa.table({k: [r[k] for r in rows] for k in ROWS[0]}), d / name)
    ds = open_packed(d)
    assert [ds[i]["input_ids"].tolist() for i in range(3)] == [r["input_ids"] for r in ROWS]


def test_parquet_rejects_missing_column_and_wrong_type(tmp_path):
    pq.write_table(pa.table({"input_ids": [[1]], "loss_mask": [[0]]}), tmp_path / "a.parquet")
    with pytest.raises(FormatError, match="a.parquet: missing column\\(s\\) seq_start_id"):
        PackedParquetDataset(tmp_path / "a.parquet")
    pq.write_table(pa.table({"input_ids": [[1.5]], "loss_mask": [[0]], "seq_start_id": [[0]]}),
                   tmp_path / "b.parquet")
    with pytest.raises(FormatError, match="column input_ids is list<.*double>, expected a list of int32 or int64"):
        PackedParquetDataset(tmp_path / "b.parquet")


def test_parquet_rejects_bad_rows(tmp_path):
    pq.write_table(pa.table({"input_ids": [[1, 2]], "loss_mask": [[0]], "seq_start_id": [[0]]}), tmp_path / "a.pq")
    with pytest.raises(FormatError, match="a.pq row 0: loss_mask has 1 values for 2 input_ids"):
        PackedParquetDataset(tmp_path / "a.pq")[0]
    pq.write_table(pa.table({"input_ids": [[1, 2]], "loss_mask": [[0, 0]], "seq_start_id": [[1]]}), tmp_path / "b.pq")
    with pytest.raises(FormatError, match="b.pq row 0: seq_starts must begin with 0"):
        PackedParquetDataset(tmp_path / "b.pq")[0]
    pq.write_table(pa.table({"input_ids": [[1, 2]], "loss_mask": [[0, 2]], "seq_start_id": [[0]]}), tmp_path / "c.pq")
    with pytest.raises(FormatError, match="c.pq row 0: loss_mask values must be 0 or 1"):
        PackedParquetDataset(tmp_path / "c.pq")[0]
    pq.write_table(pa.table({"input_ids": [[1, 2**40]], "loss_mask": [[0, 1]], "seq_start_id": [[0]]}),
                   tmp_path / "d.pq")
    with pytest.raises(FormatError, match="d.pq row 0: input_ids outside the int32 range"):
        PackedParquetDataset(tmp_path / "d.pq")[0]
    (tmp_path / "e.parquet").write_bytes(b"not parquet")
    with pytest.raises(FormatError, match="e.parquet: not a readable Parquet file"):
        PackedParquetDataset(tmp_path / "e.parquet")


def test_parquet_dataset_pickles_without_handles(tmp_path):
    import pickle

    pq.write_table(pa.table({k: [r[k] for r in ROWS] for k in ROWS[0]}), tmp_path / "a.parquet")
    ds = PackedParquetDataset(tmp_path / "a.parquet")
    ds[0]
    clone = pickle.loads(pickle.dumps(ds))
    assert clone._handles == {} and clone[2]["input_ids"].tolist() == [7, 8, 9]


def _legacy(path, rows=ROWS):
    np.save(path, np.array(rows, dtype=object), allow_pickle=True)
    return path


def test_legacy_npy_needs_explicit_opt_in(tmp_path):
    path = _legacy(tmp_path / "legacy.npy")
    with pytest.raises(ConfigError, match="legacy.npy: a legacy packed .npy is a pickle.*allow_pickle=True"):
        open_packed(path)
    with pytest.warns(LegacyPickleWarning, match="loading a pickled legacy packed .npy"):
        ds = open_packed(path, allow_pickle=True)
    assert isinstance(ds, LegacyPackedDataset) and ds[0]["seq_boundaries"].tolist() == [0, 2, 4]


def test_legacy_converter_round_trip(tmp_path):
    path = _legacy(tmp_path / "legacy.npy")
    with pytest.raises(ConfigError, match="allow_pickle=True"):
        convert_legacy_to_memmap(path, tmp_path / "m")
    with pytest.warns(LegacyPickleWarning):
        m = convert_legacy_to_memmap(path, tmp_path / "m", allow_pickle=True)
    assert m["pack_size"] == 4 and m["num_bins"] == 3 and m["num_sequences"] == 6
    ds = PackedMemmapDataset(tmp_path / "m")
    for i, row in enumerate(ROWS):
        assert ds[i]["input_ids"].tolist() == row["input_ids"]
        assert ds[i]["loss_mask"].tolist() == ([0, 0, 0, 0] if i == 0 else row["loss_mask"])  # ends: 0
        assert ds[i]["seq_boundaries"].tolist() == row["seq_start_id"] + [len(row["input_ids"])]


def test_a_foreign_mask_with_ones_at_sequence_ends_converts_to_a_shard_verify_accepts(tmp_path):
    """Bin 0 of ROWS trains both its sequences' last positions (1 at positions 1 and 3), which predict nothing in
    their sequence: collate_packed reads them as 0, and the converter writes them so, counting them."""
    pq.write_table(pa.table({k: [r[k] for r in ROWS] for k in ROWS[0]}), tmp_path / "foreign.parquet")
    foreign = PackedParquetDataset(tmp_path / "foreign.parquet")
    manifest = convert_to_memmap(foreign, tmp_path / "m", algorithm="converted")
    problems, checked, _ = verify_outputs(str(tmp_path / "m"))
    assert problems == [] and checked == 1
    assert main(["verify", str(tmp_path / "m")]) == 0
    assert manifest["loss_mask_ends_cleared"] == 2
    converted = PackedMemmapDataset(tmp_path / "m")
    converted.validate()
    given, read = (collate_packed([ds[i] for i in range(len(ds))], pad_to=4) for ds in (foreign, converted))
    for key in ("input_ids", "labels", "loss_mask", "position_ids", "cu_seqlens"):
        assert given[key].tolist() == read[key].tolist(), key


def test_legacy_rejects_bad_rows(tmp_path):
    path = _legacy(tmp_path / "bad.npy", [{"input_ids": [1, 2], "loss_mask": [0, 1]}])
    with pytest.warns(LegacyPickleWarning):
        ds = LegacyPackedDataset(path, allow_pickle=True)
    with pytest.raises(FormatError, match="bad.npy row 0: expected a dict with keys input_ids, loss_mask, seq_start_id"):
        ds[0]
    path = _legacy(tmp_path / "len.npy", [{"input_ids": [1, 2], "loss_mask": [0], "seq_start_id": [0]},
                                          {"input_ids": [-1], "loss_mask": [0], "seq_start_id": [0]}])
    with pytest.warns(LegacyPickleWarning):
        ds = LegacyPackedDataset(path, allow_pickle=True)
    with pytest.raises(FormatError, match="len.npy row 0: loss_mask has 1 values for 2 input_ids"):
        ds[0]
    with pytest.raises(FormatError, match="len.npy row 1: input_ids outside the int32 range"):
        ds[1]
    np.save(tmp_path / "num.npy", np.arange(4))
    with pytest.warns(LegacyPickleWarning), pytest.raises(FormatError, match="expected a 1-D object array"):
        LegacyPackedDataset(tmp_path / "num.npy", allow_pickle=True)


def test_factory_rejects_unknown_paths(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FormatError, match="empty: an empty directory"):
        open_packed(tmp_path / "empty")
    (tmp_path / "x.txt").write_text("x")
    with pytest.raises(FormatError, match="x.txt: a text file, not a token cache"):
        open_packed(tmp_path / "x.txt")
    (tmp_path / "half").mkdir()
    np.save(tmp_path / "half" / "input_ids.npy", np.zeros(4, np.int32))
    with pytest.raises(IncompleteCacheError, match="half: token files but no meta.json"):
        open_packed(tmp_path / "half")


def test_a_null_or_fractional_value_in_a_foreign_bin_is_refused_not_cast(tmp_path):
    """A null token in a packed Parquet list<int32> reads as NaN: it became token -2**31 (and a null mask value 0);
    a legacy bin's 1.5 became token 1. Each is refused, naming the file and row."""
    ids = pa.array([[1, None, 3], [4, 5]], pa.list_(pa.int32()))
    pq.write_table(pa.table({"input_ids": ids, "loss_mask": [[0, 1, 0], [1, 0]], "seq_start_id": [[0], [0]]}),
                   tmp_path / "a.parquet")
    ds = PackedParquetDataset(tmp_path / "a.parquet")
    with pytest.raises(FormatError, match=r"a.parquet row 0: input_ids holds a null or a value that is not an integer"):
        ds[0]
    assert ds[1]["input_ids"].tolist() == [4, 5]
    mask = pa.array([[0, None]], pa.list_(pa.uint8()))
    pq.write_table(pa.table({"input_ids": [[1, 2]], "loss_mask": mask, "seq_start_id": [[0]]}), tmp_path / "m.parquet")
    with pytest.raises(FormatError, match="m.parquet row 0: loss_mask values must be 0 or 1"):
        PackedParquetDataset(tmp_path / "m.parquet")[0]
    path = _legacy(tmp_path / "f.npy", [{"input_ids": [1.5, 2], "loss_mask": [0, 0], "seq_start_id": [0]}])
    with pytest.warns(LegacyPickleWarning):
        legacy = LegacyPackedDataset(path, allow_pickle=True)
    with pytest.raises(FormatError, match=r"f.npy row 0: input_ids holds a null or a value that is not an integer"):
        legacy[0]


def test_a_parquet_file_replaced_after_the_dataset_was_opened_is_refused_not_read(tmp_path):
    """Row counts are read on open and the files in each process that reads: a file written again in between (fewer
    or other rows) was read by the old counts. It is refused until the dataset is opened again."""
    import pickle

    from niels_gpt.errors import CacheMismatchError

    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({k: [r[k] for r in ROWS] for k in ROWS[0]}), path)
    ds = PackedParquetDataset(path)
    copy = pickle.loads(pickle.dumps(ds))  # what a worker process gets
    pq.write_table(pa.table({k: [r[k] for r in ROWS[1:]] for k in ROWS[0]}), path)
    for d in (ds, copy):
        with pytest.raises(CacheMismatchError, match=r"a.parquet: replaced since the dataset was opened"):
            d[0]
    assert PackedParquetDataset(path)[0]["input_ids"].tolist() == ROWS[1]["input_ids"]
