"""KempnerForge's `MemoryMappedDataset` semantics (map-style), over any format we read.

    ds = MemoryMappedDataset("cache/pretrain/wikitext/train", seq_len=1024, pack_sequences=True)
    ds[i] -> {"input_ids": int64[1024], "labels": int64[1024], "doc_ids": int64[1024]}

- Each file gives `len(file) // (seq_len + 1)` non-overlapping windows (the peer's train.py passes seq_len + 1;
  here the +1 is built in); a global index finds its file by binary search; windows never span files.
- `input_ids = w[:-1]`, `labels = w[1:]`. `pack_sequences` (needs the EOS id): doc[j] = number of EOS in
  w[:j], `doc_ids = doc[:-1]`, labels -100 where doc[:-1] != doc[1:].
- `state_dict()` = the peer's {"epoch", "total_samples"} plus "seq_len" and the resume protocol's fields;
  `load_state_dict` refuses a state from another corpus or seq_len (the peer restores blindly).

Cost: one binary search and one (seq_len + 1)-token copy per sample.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from niels_gpt.constants import IGNORE_INDEX
from niels_gpt.errors import ConfigError
from niels_gpt.formats.detect import detect_format
from niels_gpt.resume import STATE_VERSION, check_peer_state, fingerprint

STATE_KIND = "kempner_memory_mapped"


class MemoryMappedDataset(torch.utils.data.Dataset):
    def __init__(self, data_dir: str | os.PathLike, seq_len: int, *, file_pattern: str | None = None,
                 dtype=None, pack_sequences: bool = False, eos_token_id: int | None = None,
                 split: str | None = None):
        if seq_len < 1:
            raise ConfigError(f"seq_len must be >= 1, got {seq_len}")
        info = detect_format(data_dir, dtype, pattern=file_pattern).leaf(split)
        self.files = list(info.token_files)
        self.seq_len = seq_len
        self.window = seq_len + 1
        counts = np.array([tf.count // self.window for tf in self.files], dtype=np.int64)
        self.cumulative = np.concatenate([[0], np.cumsum(counts)])
        self.pack_sequences = pack_sequences
        self.eos_token_id = eos_token_id if eos_token_id is not None else info.eot_id
        if pack_sequences and self.eos_token_id is None:
            raise ConfigError(f"{data_dir}: pack_sequences needs the EOS id and the files do not record "
                              "one; pass eos_token_id=N")
        self.epoch = 0
        self._maps: list[np.ndarray] | None = None

    def __len__(self) -> int:
        return int(self.cumulative[-1])

    def _tokens(self, f: int) -> np.ndarray:
        if self._maps is None:
            self._maps = [tf.open() for tf in self.files]
        return self._maps[f]

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        n = len(self)
        if idx < 0:
            idx += n
        if not 0 <= idx < n:
            raise IndexError(f"sample {idx} out of range for {n} samples")
        # cumulative = [0, 3, 5]: idx 4 -> file 1 (searchsorted right gives 2, minus 1), local 1
        f = int(np.searchsorted(self.cumulative, idx, side="right")) - 1
        local = idx - int(self.cumulative[f])
        start = local * self.window
        w = torch.from_numpy(np.asarray(self._tokens(f)[start:start + self.window], dtype=np.int64))
        out = {"input_ids": w[:-1], "labels": w[1:].clone()}
        if self.pack_sequences:
            doc = torch.zeros(self.window, dtype=torch.int64)
            doc[1:] = torch.cumsum(w[:-1] == self.eos_token_id, 0)
            out["labels"][doc[:-1] != doc[1:]] = IGNORE_INDEX
            out["doc_ids"] = doc[:-1]
        return out

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def fingerprint(self) -> str:
        """The identity of this data in resume states: each file's name and token count, and seq_len."""
        return fingerprint(type(self).__qualname__, [[os.path.basename(tf.path), tf.count] for tf in self.files],
                           self.seq_len)

    def state_dict(self) -> dict:
        return {"kind": STATE_KIND, "version": STATE_VERSION, "fingerprint": self.fingerprint(),
                "epoch": self.epoch, "total_samples": len(self), "seq_len": self.seq_len}

    def load_state_dict(self, state: dict) -> None:
        check_peer_state(state, kind=STATE_KIND, fingerprint=self.fingerprint(), fields=("epoch",),
                         expect={"seq_len": self.seq_len, "total_samples": len(self)})
        self.epoch = int(state.get("epoch", 0))

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_maps"] = None  # a pickled memmap would copy the whole file into the worker
        return state
