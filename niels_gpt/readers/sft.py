"""SFT rows from an example stream: (x, y, y_masked) with loss on assistant tokens only.

    ds = SFTExampleDataset("cache/sft/dolly15k/train_tokens.bin", "cache/sft/dolly15k/train_idx.npy",
                           T=1024, device="cuda", eot_id=tok.eot_id)
    x, y, y_masked = ds.get_batch(B=16, generator=g)

- a row is one example (tokens[idx[i]:idx[i+1]]) cropped or padded with EOT to T+1 tokens;
- y_masked is y inside assistant spans (`assistant_span_mask`, or the cache's `{split}_mask.bin`), else -100;
- map-style too (`ds[i]`); a DataLoader batch or get_batch is one gather; a URL reads through a local mirror;
- the checks on open, `example(i)` and `trained(i)` are `SFTExamples`' (readers/sft_examples.py, no torch).
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset

from niels_gpt.constants import IGNORE_INDEX
from niels_gpt.readers.checks import count
from niels_gpt.readers.sft_examples import SFTExamples
from niels_gpt.spans import assistant_span_mask


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


class SFTExampleDataset(SFTExamples, Dataset):
    def __init__(self, tokens_path: str, idx_path: str, *, T: int, device: str, eot_id: int):
        """`tokens_path`: `<cache>/<split>_tokens.bin`, `idx_path`: its int64 offsets (`<split>_idx.npy`)."""
        super().__init__(tokens_path, idx_path, T=T, eot_id=eot_id)
        self.device = torch.device(device)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Example i as (x, y, y_masked), each (T,) int64 on the CPU: what one row of `collate` holds."""
        return tuple(self._batch([i])[0])

    def __getitems__(self, indices) -> SFTBatch:
        """[ds[i] for i in indices] in one gather, which default_collate passes through without stacking."""
        return self._batch(indices)

    def _batch(self, indices, pin: bool = False) -> SFTBatch:
        """The rows of `indices`, each checked as ds[i] checks i (the first bad one raises)."""
        idx, n = np.asarray(indices), len(self.offsets)
        if len(idx) and (idx.dtype.kind not in "iu" or idx.min() < -n or idx.max() >= n):
            for i in indices:  # the first bad one
                if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
                    raise TypeError(f"SFTExampleDataset indices are integers, got {type(i).__name__}")
                if not -n <= i < n:
                    raise IndexError(f"example {i} is out of range for {n} examples in {self.idx_path}")
        return SFTBatch(self._rows_tensor(idx.astype(np.int64) % n, pin))

    def get_batch(self, *, B: int, generator: "torch.Generator"
                  ) -> tuple["torch.LongTensor", "torch.LongTensor", "torch.LongTensor"]:
        """x, y, y_masked (B, T) int64 of B random examples; y_masked is -100 outside assistant targets."""
        if type(B) is not int or B < 1:
            B = count("get_batch", "B", B, what="a batch size")
        indices = torch.randint(len(self.offsets), (B,), generator=generator).numpy()
        return self._on_device(self._rows_tensor(indices, pin=self.device.type == "cuda"))

    def collate(self, indices) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x, y, y_masked (B, T) int64 on the device, of the examples `indices` (checked as ds[i] checks i)."""
        return self._on_device(self._batch(indices, pin=self.device.type == "cuda").out)

    def _on_device(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.device.type != "cpu":
            out = out.to(self.device, non_blocking=self.device.type == "cuda")
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
