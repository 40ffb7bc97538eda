"""Map-style windows over a pretraining cache split: sample i -> T+1 tokens at a fixed place.

The random-window dataset draws a fresh place every step; samplers, exact resumption and epochs
need the opposite: a fixed, countable set of samples. Each shard of `<cache>/<split>/` is cut into
windows of T+1 tokens with stride T (consecutive windows share one token, so every token but the
shard's first is a target exactly once per epoch); the last partial window of a shard is unused and
no window crosses a shard end.

    index -> (shard, offset): binary search in the cumulative window counts.
    Worked example: shards of 10 and 7 tokens, T=3 -> windows (10-1)//3=3 and (7-1)//3=2;
    cumulative [0, 3, 5]; index 4 -> shard 1, local window 1, tokens [3:7] of shard 1.

A URL as `cache_dir` (niels_gpt/storage) reads through a local mirror: meta.json on open, each
shard downloaded the first time an index reaches it, so a rank or worker fetches only its shards;
lengths, order, fingerprint and resume state are those of the local cache. A remote shard is mapped
only while an item or batch reads it (`readers.mmap.gather_remote`): a shard the download cache's
bound evicts frees its disk at once, in every worker.

Compressed shards (`shard_*.bin.zst`, niels_gpt/formats/zstd_shard.py) serve the same windows from a
frame cache (readers/frames.py): an item decompresses only the frames its window reaches.

Shards are listed as every reader lists them (`readers.shards.split_shards`: checked records, stray
shards refused) and mapped with `readers.mmap.open_tokens` (MADV_RANDOM, sized through the descriptor
they are mapped from), lazily per process and never pickled (a pickled memmap copies its contents
into every DataLoader worker). A local split is mapped back to back into one range (`open_concatenated`,
as the random-window reader maps it), so a DataLoader batch (`__getitems__`, then `collate_windows`) is
the random-window reader's own core: the windows' rows computed in place (C kernel `draws_to_rows`) and
ONE fused gather and cast into int64 x and y (`gather_xy`; numpy where it is not built), no Python loop
per shard, no per-item tensors. Cost (`bench/bench_soak.py readers`, warm page cache, one thread): 0.9-1.1x
PretrainTokenStreamDataset.get_batch's time for the same B x T (it was 2.4-3x with a gather per shard and
two int64 casts). An item is one slice of the range and one int64 copy of T+1 tokens.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from niels_gpt import _native
from niels_gpt.constants import META_NAME, TOKEN_DTYPES
from niels_gpt.errors import CacheError, ConfigError
from niels_gpt.formats.zstd_shard import ZstdShard, frame_tokens_of, is_compressed_meta
from niels_gpt.meta import read_meta
from niels_gpt.readers.checks import count
from niels_gpt.readers.frames import FrameCache
from niels_gpt.readers.mmap import gather_remote, open_concatenated, open_tokens, window_view
from niels_gpt.readers.pretrain import _CPU, _host_xy, rows_xy, to_device_xy
from niels_gpt.readers.shards import split_shards
from niels_gpt.resume import fingerprint
from niels_gpt.storage.remote import open_location


def _rows_buffer(B: int) -> tuple[torch.Tensor, np.ndarray]:
    t = torch.empty(B, dtype=torch.int64)
    return t, t.numpy()


def _split_files(cache_dir: Path, split: str, remote=None) -> tuple[dict, list[Path]]:
    meta = read_meta(str(cache_dir))
    if meta.get("kind") != "pretrain":
        raise CacheError(f"{cache_dir}/meta.json: kind {meta.get('kind')!r}, expected 'pretrain' "
                         "(indexed windows read pretraining caches)")
    names = [f"{split}/{name}" for name, _ in split_shards(cache_dir, meta, split, remote=remote is not None)]
    if not names:
        raise CacheError(f"{cache_dir}: meta.json lists no {split}/*.bin shards; "
                         f"the {split} split is empty: build the cache with a {split} split")
    return meta, [cache_dir / n for n in names]


class WindowBatch(Sequence):
    """The items of one batch of windows, gathered at once: x and y are (B, T) int64; item i is
    {"input_ids": x[i], "labels": y[i]}, as ds[i] returns it."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.y[i]}


def collate_windows(data):
    """default_collate, but a WindowBatch is already the batch: {"input_ids": x, "labels": y}, no copy."""
    if isinstance(data, WindowBatch):
        return {"input_ids": data.x, "labels": data.y}
    return torch.utils.data.default_collate(data)


class IndexedWindowDataset(torch.utils.data.Dataset):
    """`ds[i] -> {"input_ids": int64[T], "labels": int64[T]}` from `<cache_dir>/<split>/shard_*.bin`.

    `cache_dir` is the directory holding meta.json; `split` is "train" or "val".
    """

    def __init__(self, cache_dir: str | os.PathLike, T: int, *, split: str = "train"):
        T = count("IndexedWindowDataset", "T", T, what="a window length")
        local, self.remote = open_location(cache_dir)
        self.cache_dir, self.T, self.split = local, int(T), split
        meta, self.paths = _split_files(self.cache_dir, split, self.remote)
        self.dtype = np.dtype(TOKEN_DTYPES[meta["token_dtype"]])
        counts = []
        self.bytes = [int(meta["files"][f"{split}/{p.name}"]["bytes"]) for p in self.paths]  # mapped at these sizes
        for p in self.paths:
            rec = meta["files"][f"{split}/{p.name}"]
            n_tok = rec["tokens"] if "tokens" in rec else rec["bytes"] // self.dtype.itemsize
            counts.append(max(n_tok - 1, 0) // self.T)
        self.cumulative = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64).tolist()
        if self.cumulative[-1] == 0:
            raise ConfigError(f"{self.cache_dir}/{split}: no shard holds T+1={T + 1} tokens; lower T")
        self._fingerprint = fingerprint("indexed_windows", self.T, split, meta["token_dtype"],
                                        {n.name: meta["files"][f"{split}/{n.name}"].get("sha256") for n in self.paths})
        self._maps: list[np.memmap] | None = None
        self._cat = None  # the split mapped back to back (local caches): see _concatenated
        self._rows: dict[int, tuple[torch.Tensor, np.ndarray]] = {}
        self.rels = [f"{split}/{p.name}" for p in self.paths]  # as meta.json and the remote name them
        self.records = [meta["files"][r] for r in self.rels]
        self.frame_tokens = frame_tokens_of(meta, self.cache_dir / META_NAME) if is_compressed_meta(meta) else None
        self._frames: FrameCache | None = None

    def fingerprint(self) -> str:
        """Identifies (files by sha256, T, split): a resume state carries it."""
        return self._fingerprint

    def __len__(self) -> int:
        return self.cumulative[-1]

    def locate(self, index: int) -> tuple[int, int]:
        """index -> (shard number, token offset of the window in that shard)."""
        if not 0 <= index < len(self):
            raise IndexError(f"window {index} out of range [0, {len(self)})")
        shard = bisect.bisect_right(self.cumulative, index) - 1
        return shard, (index - self.cumulative[shard]) * self.T

    def shard_counts(self) -> list[int]:
        """Windows in each shard, in index order (shard k holds indices cumulative[k]..cumulative[k+1]-1)."""
        return np.diff(self.cumulative).tolist()

    def shard_files(self, indices) -> list[str]:
        """The files (paths relative to the cache) holding the windows `indices`, in first-use order:
        what a prefetcher fetches ahead of a batch (niels_gpt/loading/prefetch.py)."""
        shards = np.searchsorted(self.cumulative, np.asarray(indices, dtype=np.int64), side="right") - 1
        return [self.rels[k] for k in dict.fromkeys(shards.tolist())]

    def __getitem__(self, index: int) -> dict:
        shard, offset = self.locate(int(index))
        if self.frame_tokens is not None:
            return self._compressed_item(shard, offset)
        if self.remote is not None:
            window = gather_remote(self.remote, self.rels, self.dtype, self.bytes, np.array([shard]),
                                   np.array([offset]), self.T + 1)[0]
        elif self._concatenated() is not None:
            row = int(self._cat[2][shard]) + int(index) * self.T
            window = self._cat[0][row:row + self.T + 1]
        else:
            window = self._tokens(shard)[offset:offset + self.T + 1]
        window = torch.from_numpy(window.astype(np.int64))
        return {"input_ids": window[:-1], "labels": window[1:]}

    def __getitems__(self, indices) -> WindowBatch:
        """A batch of windows in one gather (what a DataLoader asks for with a batch sampler): the same
        items as [ds[i] for i in indices]; `collate_windows` turns it into the batch at once.

        A local cache goes through the random-window reader's core: the split's shards mapped back to back
        (`open_concatenated`), window i the T+1 tokens at row first[k] + (i - cumulative[k]) * T of that
        map, and the C kernel's fused gather and cast into int64 x and y (numpy where it is not built)."""
        if self.frame_tokens is None and self.remote is None and self._concatenated() is not None:
            return WindowBatch(*self._local_batch(indices))
        idx = np.asarray(indices, dtype=np.int64)
        if len(idx) and (idx.min() < 0 or idx.max() >= len(self)):
            self._out_of_range(idx)
        shards = np.searchsorted(self.cumulative, idx, side="right") - 1
        offsets = (idx - np.asarray(self.cumulative, dtype=np.int64)[shards]) * self.T
        if self.frame_tokens is not None:
            fc = self._frame_cache()
            v = fc.starts(shards, offsets)
            fc.ensure(v)
            return WindowBatch(*rows_xy(fc.flat, fc.base, v, self.T, self.dtype))
        if self.remote is not None:
            windows = gather_remote(self.remote, self.rels, self.dtype, self.bytes, shards, offsets, self.T + 1)
        else:
            windows = np.empty((len(idx), self.T + 1), dtype=self.dtype)
            for k in dict.fromkeys(shards.tolist()):
                rows = shards == k
                windows[rows] = self._windows(k)[offsets[rows]]
        return WindowBatch(*to_device_xy(windows, _CPU))

    def _out_of_range(self, idx: np.ndarray):
        bad = int(idx[(idx < 0) | (idx >= len(self))][0])
        raise IndexError(f"window {bad} out of range [0, {len(self)})")

    def _local_batch(self, indices) -> tuple[torch.Tensor, torch.Tensor]:
        """x, y of a local cache's windows `indices` through the concatenated map (see __getitems__)."""
        B = len(indices)
        if isinstance(indices, list):  # NOTE: what samplers hand over; min/max of a list: ~1.5 us, numpy's ~4
            bad = B and (min(indices) < 0 or max(indices) >= len(self))
        else:
            indices = np.asarray(indices, dtype=np.int64)
            bad = B and (indices.min() < 0 or indices.max() >= len(self))
        if bad:
            self._out_of_range(np.asarray(indices, dtype=np.int64))
        native = _native.gather
        if native is None or not self.dtype.isnative:
            idx = np.asarray(indices, dtype=np.int64)
            rows = idx * self.T + self._cat[2][np.searchsorted(self._cum64, idx, side="right") - 1]
            return rows_xy(self._cat[0], self._cat[1], rows, self.T, self.dtype)
        held = self._rows.pop(B, None) or _rows_buffer(B)  # NOTE: popped: a second thread gets its own
        t, v = held
        v[:] = indices
        v *= self.T
        rows = t.data_ptr()
        cum, K, shift = self._rows_args
        if K > 1:  # in place: i*T -> i*T + shift[k], k the shard with cum[k] <= i*T < cum[k+1]
            native.draws_to_rows(rows, B, cum, K, shift)
        x, y, _ = _host_xy(B, self.T, _CPU)
        native.gather_xy(self._cat[1], self.dtype.itemsize, rows, B, self.T, x.data_ptr())  # y follows x
        self._rows[B] = held
        return x, y

    def _concatenated(self):
        """(tokens, address of token 0, row shift per shard) of the split mapped back to back, once per
        process; None where open_concatenated is not available (then one map per shard)."""
        if self._cat is None:
            try:
                cat = open_concatenated(self.paths, self.dtype, expected_bytes=self.bytes)
            except FileNotFoundError as exc:
                raise CacheError(f"{exc.filename}: token file missing") from None
            if cat is None:
                self._cat = False
            else:
                tokens, first = cat
                self._cum64 = np.asarray(self.cumulative, dtype=np.int64)
                # window i of shard k starts at token i*T + shift[k] of the map, shift[k] = first[k] - cum[k]*T
                shift = np.ascontiguousarray(first - self._cum64[:-1] * self.T, dtype=np.int64)
                cum_t = np.ascontiguousarray(self._cum64 * self.T)
                self._rows_keep = (shift, cum_t)  # the kernel takes addresses: these live as long as the map
                self._rows_args = (cum_t.ctypes.data, len(shift), shift.ctypes.data)
                self._cat = (tokens, tokens.ctypes.data, shift)
        return self._cat or None

    def _tokens(self, shard: int) -> np.ndarray:
        """Shard `shard`'s tokens, mapped (a remote shard fetched first, and mapped again when it was
        evicted and fetched anew)."""
        return self._mapped(shard)[1]

    def _windows(self, shard: int) -> np.ndarray:
        """Every window of T+1 tokens of the shard (a view; built once per mapping: ~60 us each)."""
        return self._mapped(shard)[2]

    def _mapped(self, shard: int) -> tuple:
        """(None, tokens, windows) of a local shard, mapped once per process."""
        if self._maps is None:
            self._maps = [None] * len(self.paths)
        held = self._maps[shard]
        if held is None:
            tokens = open_tokens(self.paths[shard], self.dtype, expected_bytes=self.bytes[shard])
            held = self._maps[shard] = (None, tokens, window_view(tokens, self.T + 1))
        return held

    def _frame_cache(self) -> FrameCache:
        if self._frames is None:
            tokens = [int(r["tokens"]) for r in self.records]
            self._frames = FrameCache(tokens, self.dtype, self.frame_tokens, self.T, self._zstd_shard)
            self._maps = [None] * len(self.paths)
        return self._frames

    def _compressed_item(self, shard: int, offset: int) -> dict:
        fc = self._frame_cache()
        window = fc.window(int(fc.frame_base[shard]) * self.frame_tokens + offset)
        window = torch.from_numpy(window.astype(np.int64))
        return {"input_ids": window[:-1], "labels": window[1:]}

    def _zstd_shard(self, k: int) -> ZstdShard:
        """Shard k's reader. A remote shard is fetched (again, if it was evicted) and opened for the one
        frame load that asks for it, then let go: no map of an evicted file outlives the batch."""
        rec = self.records[k]
        if self.remote is not None:
            return ZstdShard(self.remote.fetch(self.rels[k]), self.dtype, tokens=int(rec["tokens"]),
                             frame_tokens=self.frame_tokens, expected_bytes=int(rec["bytes"]), frames=rec.get("frames"))
        if self._maps[k] is None:
            self._maps[k] = (None, ZstdShard(self.paths[k], self.dtype, tokens=int(rec["tokens"]),
                                             frame_tokens=self.frame_tokens, expected_bytes=int(rec["bytes"]),
                                             frames=rec.get("frames")))
        return self._maps[k][1]

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_maps"] = state["_frames"] = state["_cat"] = None
        state["_rows"], state["_rows_keep"], state["_rows_args"] = {}, None, None
        return state
