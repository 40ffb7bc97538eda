"""SFT rows from an example stream: (x, y, y_masked) with loss on assistant tokens only.

    ds = SFTExampleDataset("cache/sft/dolly15k/train_tokens.bin", "cache/sft/dolly15k/train_idx.npy",
                           T=1024, device="cuda", eot_id=tok.eot_id)
    x, y, y_masked = ds.get_batch(B=16, generator=g)

- Example i is tokens[idx[i] : idx[i+1]] (the last one runs to the end of the file).
- Each row is one example, truncated to its first T+1 tokens or padded with EOT to T+1;
  x = seq[:-1], y = seq[1:].
- y_masked[t] = y[t] when y[t] lies inside an assistant span (after an assistant sentinel, up to and
  including the next EOT), else -100. Padding is never a target.
- The span mask is computed from the ids alone (`assistant_span_mask`), vectorised over the batch:
  literal special strings in user text never become special ids, so the ids cannot lie about spans.
- One randint and one gather per batch; memory maps opened lazily per process (pickles as paths).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from niels_gpt.cache.meta import check_files, raise_on_problems, read_meta
from niels_gpt.cache.mmap import numpy_dtype, open_tokens
from niels_gpt.errors import CacheError, ConfigError

IGNORE_INDEX = -100


def assistant_span_mask(seqs: np.ndarray, asst_id: int, eot_id: int) -> np.ndarray:
    """Bool mask, same shape as `seqs` (..., L): True on tokens inside an assistant span.

    A token is inside when the last assistant sentinel strictly before it comes after the last EOT
    strictly before it. Worked example:

        ids   [usr] a [eot] [asst] b c [eot] [usr]
        mask    0   0   0     0    1 1   1     0
    """
    seqs = np.asarray(seqs)
    L = seqs.shape[-1]
    pos = np.arange(L)
    last_asst = np.maximum.accumulate(np.where(seqs == asst_id, pos, -1), axis=-1)
    last_eot = np.maximum.accumulate(np.where(seqs == eot_id, pos, -1), axis=-1)
    mask = np.zeros(seqs.shape, dtype=bool)
    mask[..., 1:] = last_asst[..., :-1] > last_eot[..., :-1]
    return mask


class SFTExampleDataset:
    def __init__(self, tokens_path: str, idx_path: str, *, T: int, device: str, eot_id: int):
        """
        tokens_path: uint16 tokens concatenated
        idx_path: int64 offsets array
        """
        if not isinstance(T, int) or T < 1:
            raise ConfigError(f"T must be a positive int, got {T!r}")
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
        self.asst_id = int(specials["asst"])
        self.dtype = numpy_dtype(self.meta["token_dtype"])
        names = {self.tokens_path.name, self.idx_path.name}
        problems = [p for p in check_files(self.cache_dir, self.meta) if Path(p.split(":")[0]).name in names]
        raise_on_problems(problems, self.cache_dir)
        self.num_tokens = self.tokens_path.stat().st_size // self.dtype.itemsize
        try:
            offsets = np.load(self.idx_path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise CacheError(f"{self.idx_path}: not a numeric .npy offsets file ({exc})") from exc
        self.offsets = _check_offsets(offsets, self.num_tokens, self.idx_path)
        if len(self.offsets) == 0:
            raise CacheError(f"{self.idx_path}: no examples in this split")
        self.ends = np.append(self.offsets[1:], self.num_tokens)
        self._tokens: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.offsets)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_tokens"] = None
        return state

    def _open(self) -> np.ndarray:
        if self._tokens is None:
            self._tokens = open_tokens(self.tokens_path, self.dtype)
        return self._tokens

    def example(self, i: int) -> np.ndarray:
        """The full token ids of example i (a view of the memory map)."""
        return self._open()[self.offsets[i]:self.ends[i]]

    def rows(self, indices: np.ndarray) -> np.ndarray:
        """(len(indices), T+1) int64: examples truncated or EOT-padded; padding marked by -1 first."""
        tokens = self._open()
        starts = self.offsets[indices]
        lengths = np.minimum(self.ends[indices] - starts, self.T + 1)
        ar = np.arange(self.T + 1)
        valid = ar[None, :] < lengths[:, None]
        pos = np.where(valid, starts[:, None] + ar[None, :], 0)
        seqs = tokens[pos].astype(np.int64)
        seqs[~valid] = -1
        return seqs

    def get_batch(self, *, B: int, generator: "torch.Generator"
                  ) -> tuple["torch.LongTensor", "torch.LongTensor", "torch.LongTensor"]:
        """
        returns (x, y, y_masked) where:
          x: (B,T) int64
          y: (B,T) int64 (next-token targets)
          y_masked: (B,T) int64 where non-assistant targets are -100 (ignore_index)
        """
        if B < 1:
            raise ConfigError(f"B must be >= 1, got {B}")
        indices = torch.randint(len(self.offsets), (B,), generator=generator).numpy()
        return self.collate(indices)

    def collate(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        seqs = self.rows(np.asarray(indices))
        pad = seqs < 0
        seqs[pad] = self.eot_id
        trained = assistant_span_mask(seqs, self.asst_id, self.eot_id) & ~pad
        y = seqs[:, 1:]
        y_masked = np.where(trained[:, 1:], y, IGNORE_INDEX)
        out = torch.from_numpy(np.stack([seqs[:, :-1], y, y_masked]))
        if self.device.type == "cuda":
            out = out.pin_memory().to(self.device, non_blocking=True)
        elif self.device.type != "cpu":
            out = out.to(self.device)
        return out[0], out[1], out[2]


def _check_offsets(offsets: np.ndarray, num_tokens: int, path: Path) -> np.ndarray:
    if offsets.ndim != 1 or offsets.dtype.kind not in "iu":
        raise CacheError(f"{path}: expected a 1-D integer offsets array, got {offsets.dtype} {offsets.shape}")
    offsets = offsets.astype(np.int64, copy=False)
    if len(offsets):
        if offsets[0] != 0:
            raise CacheError(f"{path}: first offset is {offsets[0]}, expected 0")
        if (np.diff(offsets) <= 0).any():
            bad = int(np.flatnonzero(np.diff(offsets) <= 0)[0]) + 1
            raise CacheError(f"{path}: offset {bad} ({offsets[bad]}) does not increase: empty or reordered example")
        if offsets[-1] >= num_tokens:
            raise CacheError(f"{path}: last offset {offsets[-1]} is not inside the token file "
                             f"({num_tokens} tokens): the token file is truncated")
    return offsets
