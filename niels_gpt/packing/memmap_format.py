"""The memmap_padded_v1 packed-SFT layout: writer, manifest, loss-mask shift, and the reader's checks on open.

One shard is a directory of five NumPy .npy files (NPY v1, C order, little-endian) and a manifest:

| file             | dtype | shape                  | content                                            |
|------------------|-------|------------------------|----------------------------------------------------|
| input_ids.npy    | <i4   | [num_bins, pack_size]  | tokens of bin b in [b, :packed_len[b]], then pad_id |
| loss_mask.npy    | <u1   | [num_bins, pack_size]  | 0/1, see the convention below; 0 in the padding    |
| packed_len.npy   | <u4   | [num_bins]             | tokens in bin b (1..pack_size)                     |
| seq_offsets.npy  | <u4   | [num_bins + 1]         | CSR pointers: bin b's starts are seq_starts[o[b]:o[b+1]] |
| seq_starts.npy   | <u4   | [num_sequences]        | start of each sequence in its bin: first 0, strictly increasing, < packed_len |
| manifest.json    | JSON  |                        | written last: the commit marker                    |

Sequence i of bin b spans [starts[i], starts[i+1]) with the bin's packed_len closing the last one.
Loss-mask convention (`loss_mask_convention` = "shift_left_within_sequence"): `loss_mask[b, j]` says
whether predicting `input_ids[b, j+1]` counts: the trained mask m shifted left by one *within each
sequence*, 0 at the last position of every sequence, so no target crosses a boundary (the convention of
Megatron-Bridge/Nemotron packed data; `shift_within_sequences`):

    tokens     [usr] h  i [eot] [asst] y  o [eot] | [usr] ...
    m            0   0  0   0     0    1  1   1   |   0
    loss_mask    0   0  0   0     1    1  1   0   |   0

manifest.json: `format`, `version`, the counts, `pad_id`, `files` {array -> name, dtype, shape, bytes, sha256},
`algorithm`, `efficiency`, `truncated`, `loss_mask_convention`, `source` (the SFT cache, with its token file's
sha256) and `record_sha256`, its own checksum (niels_gpt/seals.py), checked on every open.

Writing: each array is an `np.lib.format.open_memmap` under a temporary name, filled bin by bin, fsynced and
renamed; the manifest comes last. Memory is O(pack_size) per bin (the arrays live in the page cache).
"""

from __future__ import annotations

import contextlib
import json
import operator
import os
from pathlib import Path

import numpy as np

from niels_gpt.atomic import commit, remove_stale_temporaries, tmp_name, write_bytes_atomic
from niels_gpt.confine import confined
from niels_gpt.constants import MANIFEST_NAME
from niels_gpt.errors import CacheMismatchError, ConfigError, FormatError, IncompleteCacheError
from niels_gpt.formats.npy import read_npy_header
from niels_gpt.meta import file_record
from niels_gpt.seals import seal_problem, sealed_bytes

FORMAT_NAME = "memmap_padded_v1"
FORMAT_VERSION = 1
PAD_ID = 0
ARRAYS = ("input_ids", "loss_mask", "packed_len", "seq_offsets", "seq_starts")
DTYPES = {"input_ids": "<i4", "loss_mask": "<u1", "packed_len": "<u4", "seq_offsets": "<u4",
          "seq_starts": "<u4"}
MAX_INDEX = np.iinfo(np.uint32).max
COLUMNS = ("input_ids", "loss_mask", "seq_start_id")  # a bin of packed Parquet and of a legacy .npy
REQUIRED_MANIFEST = ("format", "version", "num_bins", "pack_size", "num_sequences", "files",
                     "loss_mask_convention")
LOSS_MASK_CONVENTION = "shift_left_within_sequence"
LOSS_MASK_CONVENTION_TEXT = (
    "loss_mask[j] == 1 iff predicting input_ids[j+1] from position j is trained; shifted within each "
    "packed sequence, the last position of every sequence is 0; padding is 0"
)


class MemmapShardWriter:
    """Stream bins into one memmap_padded_v1 shard directory; `finalize()` commits it. As a context manager,
    an exception removes the temporary files."""

    def __init__(self, output_dir, num_bins: int, pack_size: int, num_sequences: int):
        if num_bins < 0 or pack_size < 1 or num_sequences < num_bins:
            raise ConfigError(f"{output_dir}: bad shard sizes num_bins={num_bins} pack_size={pack_size} "
                              f"num_sequences={num_sequences} (every bin holds at least one sequence)")
        if num_sequences > MAX_INDEX or pack_size > MAX_INDEX:
            raise ConfigError(f"{output_dir}: {num_sequences} sequences do not fit the uint32 index of "
                              f"{FORMAT_NAME}; split the data into several shards")
        self.output_dir = Path(output_dir)
        self.num_bins, self.pack_size, self.num_sequences = int(num_bins), int(pack_size), int(num_sequences)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(self.output_dir)
        self._shapes = expected_shapes(vars(self))
        self._tmp = {name: tmp_name(self.output_dir / f"{name}.npy") for name in ARRAYS}
        self._arrays = {name: _open_array(self._tmp[name], DTYPES[name], self._shapes[name]) for name in ARRAYS}
        self._seq_pos = 0
        self._bins_written = 0
        self._tokens = 0

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()

    def write_bin(self, input_ids, loss_mask, seq_starts) -> None:
        """Append the next bin. Arrays are 1-D; their length is the bin's packed length."""
        b = self._bins_written
        n = len(input_ids)
        where = f"{self.output_dir} bin {b}"
        if b >= self.num_bins:
            raise ConfigError(f"{where}: the shard was sized for {self.num_bins} bins")
        if not 1 <= n <= self.pack_size or len(loss_mask) != n:
            raise ConfigError(f"{where}: {n} tokens and {len(loss_mask)} mask values; need equal "
                              f"lengths in 1..{self.pack_size}")
        starts = np.asarray(seq_starts, dtype=np.int64)
        check_starts(starts, n, where)
        if self._seq_pos + len(starts) > self.num_sequences:
            raise ConfigError(f"{where}: more sequences than the {self.num_sequences} the shard was sized for")
        a = self._arrays
        a["input_ids"][b, :n] = input_ids
        a["loss_mask"][b, :n] = loss_mask
        a["packed_len"][b] = n
        a["seq_starts"][self._seq_pos:self._seq_pos + len(starts)] = starts
        self._seq_pos += len(starts)
        a["seq_offsets"][b + 1] = self._seq_pos
        self._bins_written += 1
        self._tokens += n

    def finalize(self, **manifest_extra) -> dict:
        """Flush, rename every array into place, then write manifest.json (the commit marker)."""
        if self._bins_written != self.num_bins or self._seq_pos != self.num_sequences:
            self.abort()
            raise ConfigError(f"{self.output_dir}: wrote {self._bins_written}/{self.num_bins} bins and "
                              f"{self._seq_pos}/{self.num_sequences} sequences; the shard is incomplete")
        # NOTE: the old manifest goes first: a kill between two renames below must not leave a marker that
        # describes a mix of old and new arrays (equal shapes would pass every check).
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.output_dir / MANIFEST_NAME)
        records = {}
        for name in ARRAYS:
            arr = self._arrays.pop(name)
            if isinstance(arr, np.memmap):
                arr.flush()
            del arr
            records[name] = file_record(self._tmp[name], None)
            commit(self._tmp[name], self.output_dir / f"{name}.npy")
        manifest = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "num_bins": self.num_bins,
            "pack_size": self.pack_size,
            "num_sequences": self.num_sequences,
            "num_tokens": self._tokens,
            "pad_id": PAD_ID,
            "efficiency": self._tokens / (self.num_bins * self.pack_size) if self.num_bins else 1.0,
            "files": {name: {"name": f"{name}.npy", "dtype": DTYPES[name], "shape": list(self._shapes[name]),
                             **records[name]} for name in ARRAYS},
            "loss_mask_convention": LOSS_MASK_CONVENTION,
            "loss_mask_convention_text": LOSS_MASK_CONVENTION_TEXT,
        }
        manifest.update(manifest_extra)
        data = sealed_bytes(manifest)
        write_bytes_atomic(self.output_dir / MANIFEST_NAME, data)
        return json.loads(data)

    def abort(self) -> None:
        self._arrays.clear()
        for path in self._tmp.values():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def shift_within_sequences(mask, seq_starts, length: int | None = None, out=None) -> np.ndarray:
    """uint8 loss mask: out[j] = mask[j+1] inside each sequence, 0 at each sequence's last position and from
    `length` (default len(mask)) on; `seq_starts` begin with 0."""
    mask = np.asarray(mask)
    length = len(mask) if length is None else int(length)
    if out is None:
        out = np.zeros(len(mask), dtype=np.uint8)
    else:
        out[length:] = 0
    if length == 0:
        return out
    out[:length - 1] = mask[1:length]
    ends = np.append(np.asarray(seq_starts, dtype=np.int64)[1:], length) - 1
    out[ends] = 0
    return out


def _open_array(path, dtype: str, shape: tuple) -> np.ndarray:
    # NOTE: numpy cannot mmap a zero-byte payload, so empty arrays are written whole and returned as
    # ordinary arrays (nothing will be written into them).
    if int(np.prod(shape)) == 0:
        arr = np.zeros(shape, dtype=dtype)
        with open(path, "wb") as f:
            np.lib.format.write_array(f, arr, allow_pickle=False)
        return arr
    return np.lib.format.open_memmap(path, mode="w+", dtype=np.dtype(dtype), shape=shape)


def check_starts(starts: np.ndarray, length: int, where: str) -> None:
    """seq_starts of one bin: first 0, strictly increasing, every start < length."""
    if len(starts) == 0 or starts[0] != 0:
        raise FormatError(f"{where}: seq_starts must begin with 0, got {starts[:4].tolist()}")
    if np.any(np.diff(starts) <= 0):
        raise FormatError(f"{where}: seq_starts must strictly increase, got {starts.tolist()[:16]}")
    if starts[-1] >= length:
        raise FormatError(f"{where}: seq_start {int(starts[-1])} is not below packed_len {length}")


def bin_index(idx, n: int, where: str) -> int:
    """`idx` (an integer of any kind; negative counts from the end) checked against `n` bins."""
    if isinstance(idx, bool) or not hasattr(idx, "__index__"):  # not cut to an int: 1.5, "1"
        raise TypeError(f"{where}: bin indices are integers, got {idx!r} ({type(idx).__name__})")
    idx = operator.index(idx) + (n if operator.index(idx) < 0 else 0)
    if not 0 <= idx < n:
        raise IndexError(f"{where}: index {idx} out of range for {n} bins")
    return idx


def packed_item(ids: np.ndarray, mask: np.ndarray, starts: np.ndarray, where: str) -> dict:
    """One bin of a foreign packed format (Parquet, legacy .npy) as the datasets return it, checked."""
    if len(mask) != len(ids):
        raise FormatError(f"{where}: loss_mask has {len(mask)} values for {len(ids)} input_ids")
    if not ((mask == 0) | (mask == 1)).all():  # a null (NaN from Parquet, None from a pickle) is neither
        raise FormatError(f"{where}: loss_mask values must be 0 or 1")
    for name, a in (("input_ids", ids), ("seq_start_id", starts)):
        # NOTE: a row group with a null reads as floats: exact integers pass; a null (NaN) or 1.5 is not cast
        if len(a) and not (a.dtype.kind in "iu" or a.dtype.kind == "f" and np.all(np.isfinite(a) & (a % 1 == 0))):
            raise FormatError(f"{where}: {name} holds a null or a value that is not an integer ({a.dtype}); "
                              "every value must be an integer: fix or drop this bin")
    starts = starts.astype(np.int64)
    check_starts(starts, len(ids), where)
    if len(ids) and (ids.min() < 0 or ids.max() > np.iinfo(np.int32).max):
        raise FormatError(f"{where}: input_ids outside the int32 range")
    return {"input_ids": ids.astype(np.int32, copy=True), "loss_mask": mask.astype(np.uint8),
            "seq_boundaries": np.append(starts, len(ids))}


def read_manifest(shard_dir) -> dict:
    """Read and check manifest.json of a memmap_padded_v1 shard, then its seal; raise with the field and the fix."""
    shard_dir = Path(shard_dir)
    path = shard_dir / MANIFEST_NAME
    if not path.is_file():
        raise IncompleteCacheError(f"no {MANIFEST_NAME} in {shard_dir}: the packing was interrupted or never "
                                   "ran; re-run `pack-sft`")
    try:
        data = path.read_bytes()
        manifest = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(f"{path}: not valid JSON ({exc}); re-run `pack-sft`") from exc
    if not isinstance(manifest, dict):
        raise FormatError(f"{path}: expected a JSON object, got {type(manifest).__name__}")
    missing = [k for k in REQUIRED_MANIFEST if k not in manifest]
    if missing:
        raise FormatError(f"{path}: missing field(s) {', '.join(missing)}; re-run `pack-sft`")
    if manifest["format"] != FORMAT_NAME:
        raise FormatError(f"{path}: format {manifest['format']!r}, expected {FORMAT_NAME!r}")
    if manifest["version"] != FORMAT_VERSION:
        raise FormatError(f"{path}: version {manifest['version']!r} is not supported (this reader reads "
                          f"version {FORMAT_VERSION}); re-pack with this version")
    if manifest["loss_mask_convention"] != LOSS_MASK_CONVENTION:
        raise FormatError(f"{path}: loss_mask_convention {manifest['loss_mask_convention']!r} is not "
                          f"{LOSS_MASK_CONVENTION!r}; re-pack the data")
    for key in ("num_bins", "pack_size", "num_sequences"):
        value = manifest[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise FormatError(f"{path}: {key} must be a non-negative integer, got {value!r}")
    files = manifest["files"]
    if not isinstance(files, dict) or sorted(files) != sorted(ARRAYS):
        raise FormatError(f"{path}: files must list exactly {', '.join(ARRAYS)}")
    for name in ARRAYS:
        confined(files[name].get("name") if isinstance(files[name], dict) else None, path, f"files.{name}.name",
                 parts=1, pattern=r"[^/]+\.npy", error=FormatError, fix="re-pack the data")
        if files[name].get("dtype") != DTYPES[name]:
            raise FormatError(f"{path}: files.{name}.dtype is {files[name].get('dtype')!r}, expected "
                              f"{DTYPES[name]!r}")
    problem = seal_problem(path, data, manifest, "re-run `pack-sft`")  # last: the checks above name the field
    if problem is not None:
        raise CacheMismatchError(problem)
    return manifest


def expected_shapes(manifest: dict) -> dict[str, tuple]:
    nb, ps, ns = manifest["num_bins"], manifest["pack_size"], manifest["num_sequences"]
    return {"input_ids": (nb, ps), "loss_mask": (nb, ps), "packed_len": (nb,),
            "seq_offsets": (nb + 1,), "seq_starts": (ns,)}


def check_headers(shard_dir, manifest: dict) -> dict[str, Path]:
    """Read each array's .npy header (not its data) and compare dtype and shape with the manifest."""
    shard_dir = Path(shard_dir)
    paths = {}
    for name, shape in expected_shapes(manifest).items():
        path = shard_dir / manifest["files"][name]["name"]
        if not path.is_file():
            raise FormatError(f"{path}: missing ({shard_dir / MANIFEST_NAME} lists it); re-run `pack-sft`")
        got_shape, fortran, dtype, data_start = read_npy_header(path, "re-run `pack-sft`")
        if dtype != np.dtype(DTYPES[name]) or fortran:
            raise FormatError(f"{path}: dtype {dtype.str} (fortran_order={fortran}), expected C-order "
                              f"{DTYPES[name]}")
        if tuple(got_shape) != tuple(shape):
            raise FormatError(f"{path}: shape {tuple(got_shape)} disagrees with the manifest's {tuple(shape)}")
        need = data_start + int(np.prod(shape)) * dtype.itemsize
        size = path.stat().st_size
        if size != need:
            raise FormatError(f"{path}: {size} bytes, expected {need} for shape {tuple(shape)}; truncated?")
        paths[name] = path
    return paths
