"""Packed Parquet, the packed-SFT format that Nemotron writes and Megatron-Bridge reads.

One row per bin; columns (Nemotron `packing/writers.py`, Megatron-Bridge `data/packing/parquet.py`):

| column       | arrow type   | content                                                         |
|--------------|--------------|-----------------------------------------------------------------|
| input_ids    | list<int32>  | the bin's tokens, no padding                                   |
| loss_mask    | list<uint8>  | same length; Megatron-Bridge itself writes list<int8>           |
| seq_start_id | list<int32>  | sequence starts: first 0, strictly increasing, < len(input_ids) |

The loss mask is shifted within each sequence, as in memmap_padded_v1. The reader also accepts Megatron-Bridge's
own output (list<int64> ids and starts, list<int8> mask). Readers open files lazily per process and keep the
last decoded row group, so sequential reads decode each row group once.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from niels_gpt.atomic import atomic_path, file_identity
from niels_gpt.constants import PARQUET_SUFFIXES
from niels_gpt.errors import CacheMismatchError, FormatError
from niels_gpt.meta import sha256_file
from niels_gpt.packing.memmap_format import COLUMNS, bin_index, packed_item
from niels_gpt.resume import fingerprint

ROW_GROUP_SIZE = 500  # Megatron-Bridge's default


def write_packed_parquet(dataset, path, *, row_group_size: int = ROW_GROUP_SIZE) -> int:
    """Write every bin of a packed dataset to one Parquet file, atomically. Returns the number of rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.uint8())),
                        ("seq_start_id", pa.list_(pa.int32()))])
    n = len(dataset)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        with pq.ParquetWriter(os.fspath(tmp), schema) as writer:
            for r0 in range(0, n, row_group_size):
                items = [dataset[i] for i in range(r0, min(r0 + row_group_size, n))]
                ids = [np.asarray(it["input_ids"], dtype=np.int32) for it in items]
                masks = [np.asarray(it["loss_mask"], dtype=np.uint8) for it in items]
                starts = [np.asarray(it["seq_boundaries"][:-1], dtype=np.int32) for it in items]
                cols = [_list_array(pa, ids, pa.int32()), _list_array(pa, masks, pa.uint8()),
                        _list_array(pa, starts, pa.int32())]
                writer.write_table(pa.Table.from_arrays(cols, schema=schema), row_group_size=row_group_size)
    return n


def _list_array(pa, parts: list[np.ndarray], value_type):
    offsets = np.cumsum([0, *(len(p) for p in parts)], dtype=np.int32)
    values = np.concatenate(parts) if parts else np.zeros(0)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values, value_type))


def parquet_files(path) -> list[Path]:
    """A .parquet/.pq file, or the sorted .parquet/.pq files of a directory."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in PARQUET_SUFFIXES and p.is_file())
        if not files:
            raise FormatError(f"{path}: no .parquet or .pq files (and no manifest.json)")
        return files
    if not path.is_file():
        raise FormatError(f"{path}: no such packed Parquet file or directory")
    return [path]


class PackedParquetDataset:
    """Packed Parquet file(s) as a map-style dataset with the same items as PackedMemmapDataset."""

    def __init__(self, path):
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.path = str(path)
        self.files = [str(p) for p in parquet_files(path)]
        rows, self._group_offsets = [], []
        for f in self.files:
            try:
                md = pq.read_metadata(f)
                schema = pq.read_schema(f)
            except (OSError, pa.ArrowException) as exc:
                raise FormatError(f"{f}: not a readable Parquet file ({exc})") from exc
            _check_schema(pa, schema, f)
            self._group_offsets.append(np.cumsum([0, *(md.row_group(g).num_rows for g in range(md.num_row_groups))],
                                                 dtype=np.int64))
            rows.append(md.num_rows)
        self.file_offsets = np.cumsum([0, *rows], dtype=np.int64)
        self._handles: dict = {}
        self._ids = [file_identity(f) for f in self.files]  # a file replaced since is refused, not read
        self._cached = None  # ((file, group), decoded columns)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_handles"], state["_cached"] = {}, None
        return state

    def __len__(self) -> int:
        return int(self.file_offsets[-1])

    def _group(self, fi: int, gi: int) -> dict:
        if self._cached is not None and self._cached[0] == (fi, gi):
            return self._cached[1]
        import pyarrow.parquet as pq

        if fi not in self._handles:
            if file_identity(self.files[fi]) != self._ids[fi]:
                raise CacheMismatchError(f"{self.files[fi]}: replaced since the dataset was opened: open it again")
            self._handles[fi] = pq.ParquetFile(self.files[fi])
        table = self._handles[fi].read_row_group(gi, columns=list(COLUMNS))
        cols = {}
        for name in COLUMNS:
            arr = table.column(name).combine_chunks()
            cols[name] = (np.asarray(arr.offsets, dtype=np.int64), arr.values.to_numpy(zero_copy_only=False))
        self._cached = ((fi, gi), cols)
        return cols

    def __getitem__(self, idx: int) -> dict:
        idx = bin_index(idx, len(self), self.path)
        fi = int(np.searchsorted(self.file_offsets, idx, side="right")) - 1
        row = idx - int(self.file_offsets[fi])
        gi = int(np.searchsorted(self._group_offsets[fi], row, side="right")) - 1
        r = row - int(self._group_offsets[fi][gi])
        ids, mask, starts = (values[offsets[r]:offsets[r + 1]] for offsets, values in self._group(fi, gi).values())
        return packed_item(ids, mask, starts, f"{self.files[fi]} row {row}")

    def fingerprint(self) -> str:
        """The identity of these rows in resume states: each file's name and sha256 (read once, when asked)."""
        return fingerprint("packed_parquet", [[os.path.basename(f), sha256_file(f)] for f in self.files])


def _check_schema(pa, schema, where: str) -> None:
    missing = [c for c in COLUMNS if c not in schema.names]
    if missing:
        raise FormatError(f"{where}: missing column(s) {', '.join(missing)}; packed Parquet needs "
                          f"{', '.join(COLUMNS)} (found {', '.join(schema.names)})")
    # NOTE: a writer that passes Python lists gets list<int64>; any integer mask type is accepted and
    # its values are checked per row.
    allowed = {"input_ids": ("int32", "int64"),
               "loss_mask": ("uint8", "int8", "bool", "int16", "uint16", "int32", "uint32", "int64", "uint64"),
               "seq_start_id": ("int32", "int64")}
    for name, ok in allowed.items():
        t = schema.field(name).type
        if not (pa.types.is_list(t) or pa.types.is_large_list(t)) or str(t.value_type) not in ok:
            raise FormatError(f"{where}: column {name} is {t}, expected a list of {' or '.join(ok[:3])}")
