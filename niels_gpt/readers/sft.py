"""SFT rows from an example stream: (x, y, y_masked) with loss on assistant tokens only.

    ds = SFTExampleDataset("cache/sft/dolly15k/train_tokens.bin", "cache/sft/dolly15k/train_idx.npy",
                           T=1024, device="cuda", eot_id=tok.eot_id)
    x, y, y_masked = ds.get_batch(B=16, generator=g)

- a row is one example (tokens[idx[i]:idx[i+1]]) cropped or padded with EOT to T+1 tokens;
- y_masked is y inside assistant spans (`assistant_span_mask`, or the cache's `{split}_mask.bin`), else -100;
- map-style too (`ds[i]`); a DataLoader batch or get_batch is one gather; a URL reads through a local mirror.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from niels_gpt.constants import IGNORE_INDEX
from niels_gpt.errors import CacheError, ConfigError
from niels_gpt.meta import (
    check_files,
    check_sft_offsets,
    load_checked_npy,
    numpy_dtype,
    raise_on_problems,
    read_meta,
)
from niels_gpt.readers.checks import count
from niels_gpt.readers.mmap import open_tokens, window_view
from niels_gpt.resume import cache_fingerprint
from niels_gpt.spans import assistant_span_mask
from niels_gpt.storage.remote import open_location, split_url
from niels_gpt.urls import is_url


class SFTRow(tuple):
    """(x, y, y_masked) of row i of an SFTBatch: what ds[i] returns (its own type, for default_collate)."""


class SFTBatch:
    """One DataLoader batch gathered at once: `out` is (3, B, T) int64 (x, y, y_masked), item i equals
    ds[indices[i]]; default_collate hands the planes back as the batch (`collate_rows`)."""

    def __init__(self, out: torch.Tensor):
        self.out = out

    def __len__(self) -> int:
        return self.out.shape[1]

    def __getitem__(self, i: int) -> SFTRow:
        if not -len(self) <= i < len(self):
            raise IndexError(f"row {i} of a batch of {len(self)}")
        i %= len(self)
        return SFTRow((self.out[0, i], self.out[1, i], self.out[2, i]))


def collate_rows(batch, *, collate_fn_map=None) -> list[torch.Tensor]:
    """default_collate of SFT rows: [x, y, y_masked] (B, T) each, as it collates any list of 3-tuples;
    a whole SFTBatch is its planes as they are (no copy)."""
    if isinstance(batch, SFTBatch):
        return [batch.out[0], batch.out[1], batch.out[2]]
    return [torch.stack([row[k] for row in batch]) for k in range(3)]


torch.utils.data._utils.collate.default_collate_fn_map[SFTRow] = collate_rows  # torch's documented extension point


class SFTExampleDataset(Dataset):
    def __init__(self, tokens_path: str, idx_path: str, *, T: int, device: str, eot_id: int):
        """`tokens_path`: `<cache>/<split>_tokens.bin`, `idx_path`: its int64 offsets (`<split>_idx.npy`)."""
        T = count("SFTExampleDataset", "T", T, what="a window length")
        self.remote = None
        if is_url(tokens_path) or is_url(idx_path):
            (tok_dir, tok_name), (idx_dir, idx_name) = split_url(tokens_path), split_url(idx_path)
            if tok_dir != idx_dir:
                raise ConfigError(f"{tokens_path} and {idx_path}: the tokens and offsets of one split live in "
                                  "one cache directory; give both from the same one")
            local, self.remote = open_location(tok_dir)
            tokens_path, idx_path = local / tok_name, local / idx_name
        self.tokens_path, self.idx_path = Path(tokens_path), Path(idx_path)
        self.T, self.device, self.eot_id = T, torch.device(device), int(eot_id)
        self.cache_dir = self.tokens_path.parent
        self.meta = read_meta(str(self.cache_dir))
        if self.meta.get("kind") != "sft":
            raise CacheError(f"{self.cache_dir}: not an SFT cache (kind={self.meta.get('kind')!r})")
        specials = self.meta["special_token_ids"]
        if specials["eot"] != self.eot_id:
            raise ConfigError(f"eot_id={eot_id} but {self.cache_dir}/meta.json records eot={specials['eot']}: "
                              "pass the EOT id of the tokenizer that built this cache")
        self.dtype = numpy_dtype(self.meta["token_dtype"])
        mask_name = self.tokens_path.name.replace("_tokens.bin", "_mask.bin")
        self.mask_path = self.cache_dir / mask_name if mask_name in self.meta["files"] else None
        if specials.get("asst") is None and self.mask_path is None:
            raise CacheError(f"{self.cache_dir}/meta.json: no assistant sentinel (special_token_ids.asst is null) "
                             f"and no {mask_name} recorded, so no token can be trained; rebuild the cache")
        self.asst_id = None if specials.get("asst") is None else int(specials["asst"])
        names = {self.tokens_path.name, self.idx_path.name} | ({mask_name} if self.mask_path else set())
        problems = [p for p in check_files(self.cache_dir, self.meta) if Path(p.split(":")[0]).name in names]
        if self.remote is not None:  # fetched on first use; size and sha256 checked then
            self.remote.fetch(self.idx_path.name)
            problems = [p for p in problems if ": missing (meta lists" not in p]
        raise_on_problems(problems, self.cache_dir)
        rec = self.meta["files"].get(self.tokens_path.name)
        if self.remote is not None and rec is None:
            raise CacheError(f"{self.remote.url}/meta.json does not list {self.tokens_path.name}")
        size = rec["bytes"] if self.remote is not None else self.tokens_path.stat().st_size
        self.num_tokens = size // self.dtype.itemsize
        offsets = load_checked_npy(self.idx_path, self.meta["files"].get(self.idx_path.name), "offsets")
        self.offsets = check_sft_offsets(offsets, self.num_tokens, self.idx_path)
        if len(self.offsets) == 0:
            raise CacheError(f"{self.idx_path}: no examples in this split")
        self.ends = np.append(self.offsets[1:], self.num_tokens)
        if self.mask_path is not None:  # a remote mask is fetched on first use: its recorded size is checked now
            mask_bytes = (self.meta["files"][mask_name]["bytes"] if self.remote is not None
                          else self.mask_path.stat().st_size)
            if mask_bytes != self.num_tokens:
                raise CacheError(f"{self.mask_path}: {mask_bytes} bytes but {self.tokens_path.name} holds "
                                 f"{self.num_tokens} tokens (one mask byte each); rebuild the cache")
        self._mapped: dict[bool, tuple] = {}  # per process: _maps(mask) -> (file, its windows)

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Example i as (x, y, y_masked), each (T,) int64 on the CPU: what one row of `collate` holds."""
        n = len(self.offsets)
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"SFTExampleDataset indices are integers, got {type(i).__name__}")
        if not -n <= i < n:
            raise IndexError(f"example {i} is out of range for {n} examples in {self.idx_path}")
        out = self._rows_tensor(np.array([int(i) % n]))
        return out[0, 0], out[1, 0], out[2, 0]

    def __getitems__(self, indices) -> SFTBatch:
        """[ds[i] for i in indices] in one gather, which default_collate passes through without stacking."""
        idx = np.asarray(indices)
        n = len(self.offsets)
        if len(idx) and (idx.dtype.kind not in "iu" or idx.min() < -n or idx.max() >= n):
            bad = next(i for i in indices if isinstance(i, bool) or not isinstance(i, (int, np.integer))
                       or not -n <= i < n)
            self[bad]  # raises what ds[bad] raises
        return SFTBatch(self._rows_tensor(idx.astype(np.int64) % n if len(idx) else idx.astype(np.int64)))

    def fingerprint(self) -> str:
        return cache_fingerprint(self, self.cache_dir, self.meta, self.T)

    def __getstate__(self):
        return {**self.__dict__, "_mapped": {}}

    def _maps(self, mask: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
        """(the token or mask file mapped; its windows of T+1, None if shorter), once per process."""
        if mask not in self._mapped:
            path, dtype = (self.mask_path, np.dtype(np.uint8)) if mask else (self.tokens_path, self.dtype)
            if self.remote is not None:
                self.remote.fetch(path.name)
            a = open_tokens(path, dtype, expected_bytes=self.num_tokens * dtype.itemsize)
            self._mapped[mask] = (a, window_view(a, self.T + 1) if len(a) > self.T else None)
        return self._mapped[mask]

    def example(self, i: int) -> np.ndarray:
        """The full token ids of example i (a view of the memory map)."""
        return self._maps()[0][self.offsets[i]:self.ends[i]]

    def trained(self, i: int) -> np.ndarray:
        """Bool per token of example i: whether it is a trained target (stored mask, else the span rule)."""
        if self.mask_path is None:
            return assistant_span_mask(np.asarray(self.example(i)), self.asst_id, self.eot_id)
        return self._maps(mask=True)[0][self.offsets[i]:self.ends[i]].astype(bool)

    def get_batch(self, *, B: int, generator: "torch.Generator"
                  ) -> tuple["torch.LongTensor", "torch.LongTensor", "torch.LongTensor"]:
        """x, y, y_masked (B, T) int64 of B random examples; y_masked is -100 outside assistant targets."""
        if type(B) is not int or B < 1:
            B = count("get_batch", "B", B, what="a batch size")
        indices = torch.randint(len(self.offsets), (B,), generator=generator).numpy()
        return self.collate(indices)

    def collate(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cuda = self.device.type == "cuda"
        out = self._rows_tensor(np.asarray(indices), pin=cuda)
        if self.device.type != "cpu":
            out = out.to(self.device, non_blocking=cuda)
        return out[0], out[1], out[2]

    def _rows_tensor(self, indices: np.ndarray, pin: bool = False) -> torch.Tensor:
        """(3, B, T) int64 on the CPU: x, y and y_masked of the examples at `indices`."""
        starts = self.offsets[indices]
        lengths = np.minimum(self.ends[indices] - starts, self.T + 1)
        valid = np.arange(self.T + 1)[None, :] < lengths[:, None]
        w = _gather_rows(*self._maps(), starts, lengths, self.T + 1)
        # NOTE: a token's span state depends only on the tokens before it, so the mask of an example's own
        # tokens is the same before the padding is written (and has far fewer EOTs to walk).
        if self.mask_path is None:
            trained = assistant_span_mask(w, self.asst_id, self.eot_id)
        else:
            trained = _gather_rows(*self._maps(mask=True), starts, lengths, self.T + 1) != 0
        trained &= valid
        np.copyto(w, self.eot_id, where=~valid)
        B, T = len(w), self.T
        out = torch.empty((3, B, T), dtype=torch.int64, pin_memory=True) if pin else \
            torch.from_numpy(np.empty((3, B, T), dtype=np.int64))
        buf = out.numpy()
        np.copyto(buf[0], w[:, :-1], casting="unsafe")
        np.copyto(buf[1], w[:, 1:], casting="unsafe")
        buf[2].fill(IGNORE_INDEX)
        np.copyto(buf[2], buf[1], where=trained[:, 1:])
        return out


def _gather_rows(a: np.ndarray, rows: np.ndarray | None, starts: np.ndarray, lengths: np.ndarray,
                 W: int) -> np.ndarray:
    """(len(starts), W) items of `a` from each start, `lengths` of them its own (`rows`: `a`'s windows of W);
    past its own items a row holds whatever follows in `a` (callers overwrite it)."""
    if rows is None:
        out = np.empty((len(starts), W), dtype=a.dtype)
        for i, (s0, k) in enumerate(zip(starts.tolist(), lengths.tolist(), strict=True)):
            out[i, :k] = a[s0:s0 + k]
        return out
    # NOTE: rows of a sliding-window view (a memcpy each) instead of an index array of B*(T+1)
    # positions: 16x1024 rows 59 -> ~17 us (bench/bench_cache_readers.py). A row starting within
    # W items of the end of `a` is read from the last window and shifted into place.
    last = len(a) - W
    out = rows[np.minimum(starts, last)]
    for i in np.flatnonzero(starts > last):
        k = int(lengths[i])
        out[i, :k] = a[starts[i]:starts[i] + k]
    return out
