"""NeMo AutoModel's `NanogptDataset` semantics (iterable), fixed where the peer duplicates or forgets.

    ds = NanogptDataset("data/fineweb_train_*.bin", seq_len=1024, bos_token=50256, align_to_bos=True)
    for sample in ds: sample["input_ids"], sample["labels"]     # int64[seq_len] each

- Files: a glob, a list of paths, or a directory (any format detect_format reads). `shuffle_files` permutes
  them with torch.Generator(seed + epoch), the same on every rank and worker.
- Samples of a file: non-overlapping windows of seq_len + 1 tokens from 0 while a whole one fits; with
  `align_to_bos` each window starts at the first BOS at or after the end of the last (`.bos.idx` or a scan).
- Consumers = world_size x num_workers. With at least as many files, consumer c reads files c, c + C, ...;
  with fewer, the ordered samples are cut into C contiguous ranges (the peer gives every rank the same file,
  so each token is seen world_size times). Together the consumers read exactly one consumer's samples.
- `state_dict()` = {"epoch", "consumed": {consumer id: samples yielded}} plus the resume protocol's fields
  (niels_gpt.resume); after `load_state_dict` each consumer skips what it yielded (the peer restarts).

Cost: per sample one (seq_len + 1)-token copy; per file and epoch, the sample grid.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from niels_gpt.errors import ConfigError
from niels_gpt.formats import megatron
from niels_gpt.formats.base import TokenFile
from niels_gpt.formats.bos_index import load_bos_index, scan_bos
from niels_gpt.formats.detect import FormatInfo, detect_format
from niels_gpt.resume import STATE_VERSION, check_peer_state, fingerprint, resolve_rank

STATE_KIND = "nanogpt_stream"


def _resolve_files(spec, dtype) -> tuple[list[TokenFile], FormatInfo | None]:
    one = isinstance(spec, (str, os.PathLike))
    if one and (os.path.isdir(spec) or (not os.path.exists(spec) and megatron.is_megatron(spec))):
        info = detect_format(spec, dtype).leaf()
        return list(info.token_files), info
    paths = sorted(glob.glob(str(spec))) if one else [str(p) for p in spec]
    if not paths:
        raise ConfigError(f"no files match {spec!r}; check the pattern or directory")
    tfs, first = [], None
    for p in paths:
        info = detect_format(p, dtype)
        first = first or info
        tfs.extend(info.token_files)
    return tfs, first


class NanogptDataset(torch.utils.data.IterableDataset):
    def __init__(self, file_pattern: str | Sequence[str], seq_len: int, bos_token: int | None = None,
                 shuffle_files: bool = False, align_to_bos: bool = False, *, seed: int = 0,
                 dtype=None, rank: int | None = None, world_size: int | None = None):
        if seq_len < 1:
            raise ConfigError(f"seq_len must be >= 1, got {seq_len}")
        self.files, info = _resolve_files(file_pattern, dtype)
        self.seq_len, self.shuffle_files, self.align_to_bos = seq_len, shuffle_files, align_to_bos
        self.bos_token = bos_token if bos_token is not None else (info.bos_id if info else None)
        if align_to_bos and self.bos_token is None:
            raise ConfigError("align_to_bos=True needs bos_token (the id every document starts with; "
                              "for our caches and modded-nanogpt shards the EOT/<|endoftext|> id)")
        self.seed = seed
        self._rank, self._world = rank, world_size
        self.epoch = 0
        self.consumed: dict[str, int] = {}
        self._starts: dict[int, np.ndarray] = {}

    def _consumer(self) -> tuple[int, int]:
        rank, world = resolve_rank(self._rank, self._world)
        wi = torch.utils.data.get_worker_info()
        wid, nw = (wi.id, wi.num_workers) if wi is not None else (0, 1)
        return rank * nw + wid, world * nw

    def _file_starts(self, f: int) -> np.ndarray:
        if f not in self._starts:
            tf = self.files[f]
            n, span = tf.count, self.seq_len + 1
            if not self.align_to_bos:
                # n=22, seq_len=4: windows [0, 5), [5, 10), [10, 15), [15, 20); 20 + 5 > 22 ends it
                self._starts[f] = np.arange(0, max(0, n - span + 1), span, dtype=np.int64)
            else:
                tokens = tf.open()
                found = load_bos_index(tf.path, tokens, self.bos_token)
                bos = found[0] if found else scan_bos(tokens, self.bos_token)
                starts, i = [], 0
                while i < len(bos) and bos[i] + span <= n:
                    starts.append(int(bos[i]))
                    i = int(np.searchsorted(bos, bos[i] + span, side="left"))
                self._starts[f] = np.asarray(starts, dtype=np.int64)
        return self._starts[f]

    def _order(self, epoch: int) -> list[int]:
        if not self.shuffle_files:
            return list(range(len(self.files)))
        g = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(len(self.files), generator=g).tolist()

    def plan(self, consumer: int, consumers: int, epoch: int = 0) -> list[tuple[int, int, int]]:
        """(file, first sample, end sample) runs this consumer reads in `epoch`, in order."""
        order = self._order(epoch)
        if len(order) >= consumers:
            return [(f, 0, len(self._file_starts(f))) for f in order[consumer::consumers]]
        counts = np.array([len(self._file_starts(f)) for f in order], dtype=np.int64)
        total = int(counts.sum())
        lo, hi = consumer * total // consumers, (consumer + 1) * total // consumers
        runs, base = [], 0
        for f, c in zip(order, counts.tolist(), strict=True):
            a, b = max(lo, base), min(hi, base + c)
            if a < b:
                runs.append((f, a - base, b - base))
            base += c
        return runs

    def __len__(self) -> int:
        return sum(len(self._file_starts(f)) for f in range(len(self.files)))

    def __iter__(self) -> Iterator[dict]:
        consumer, consumers = self._consumer()
        key = str(consumer)
        skip = self.consumed.get(key, 0)
        done = 0
        for f, a, b in self.plan(consumer, consumers, self.epoch):
            if done + (b - a) <= skip:
                done += b - a
                continue
            tokens = self.files[f].open()
            starts = self._file_starts(f)
            for s in starts[a + max(0, skip - done):b].tolist():
                w = torch.from_numpy(np.asarray(tokens[s:s + self.seq_len + 1], dtype=np.int64))
                self.consumed[key] = self.consumed.get(key, 0) + 1
                yield {"input_ids": w[:-1], "labels": w[1:]}
            done += b - a
        # a finished pass: the next iter() is the next epoch
        self.epoch += 1
        self.consumed = {}

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        self.consumed = {}

    def fingerprint(self) -> str:
        """The identity of this data in resume states: each file's name and token count, and seq_len."""
        return fingerprint(type(self).__qualname__, [[os.path.basename(tf.path), tf.count] for tf in self.files],
                           self.seq_len, self.align_to_bos)

    def state_dict(self) -> dict:
        return {"kind": STATE_KIND, "version": STATE_VERSION, "fingerprint": self.fingerprint(),
                "epoch": self.epoch, "consumed": dict(self.consumed), "seq_len": self.seq_len,
                "align_to_bos": self.align_to_bos}

    def load_state_dict(self, state: dict) -> None:
        check_peer_state(state, kind=STATE_KIND, fingerprint=self.fingerprint(), fields=("epoch", "consumed"),
                         expect={"seq_len": self.seq_len, "align_to_bos": self.align_to_bos})
        self.epoch = int(state.get("epoch", 0))
        self.consumed = {str(k): int(v) for k, v in state.get("consumed", {}).items()}

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_starts"] = {}
        return state
