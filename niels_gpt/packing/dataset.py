"""Reading packed SFT bins: the memmap_padded_v1 dataset and the varlen collate.

- `PackedMemmapDataset(shard_dir)` checks the manifest, every .npy header and the index arrays on open, then
  maps the arrays lazily in each process (it pickles as its paths). `ds[i]` is O(1): two row slices and one
  CSR slice of `seq_starts`. `shard_dir` may be an fsspec URL: mirrored locally first (niels_gpt/storage).
- Items: `input_ids` int32[L], `loss_mask` uint8[L], `seq_boundaries` int64[S+1] (the starts, then L), the
  shape of Megatron-Bridge's packed dataset items.
- `collate_packed(items)`: `input_ids`, `labels` (-100 where the loss mask is 0), `loss_mask`, `position_ids`
  restarting in every sequence, `cu_seqlens` (int32, over the flattened [B*T] tokens, a row's padding its own
  segment) and `max_seqlen`. The mask is 0 at every sequence's last position (collate sets it so where a
  foreign bin has 1 there), so no label crosses a boundary.
"""

from __future__ import annotations

import numpy as np

from niels_gpt.atomic import file_identity
from niels_gpt.constants import IGNORE_INDEX, MANIFEST_NAME
from niels_gpt.errors import CacheMismatchError, FormatError
from niels_gpt.meta import sha256_file
from niels_gpt.packing.memmap_format import ARRAYS, bin_index, check_headers, read_manifest
from niels_gpt.resume import fingerprint
from niels_gpt.storage.remote import RemoteCache
from niels_gpt.urls import is_url

VALIDATE_CHUNK_BINS = 1024
INDEX_ARRAYS = ("packed_len", "seq_offsets", "seq_starts")  # read whole on open: hashed on open too


class PackedMemmapDataset:
    """One memmap_padded_v1 shard directory as a map-style dataset of packed bins."""

    def __init__(self, shard_dir):
        if is_url(shard_dir) and not str(shard_dir).startswith("file://"):
            # a URL: the five arrays are mirrored locally (niels_gpt/storage), each checked against the
            # manifest's size and sha256 once, then read like a local shard
            remote = RemoteCache(str(shard_dir), marker=MANIFEST_NAME)
            for rel in sorted(remote.records):
                remote.fetch(rel, keep=set(remote.records))
            shard_dir = remote.local_dir
        elif str(shard_dir).startswith("file://"):
            shard_dir = str(shard_dir)[len("file://"):]
        self.shard_dir = str(shard_dir)
        self.manifest = read_manifest(shard_dir)
        self._paths = {k: str(v) for k, v in check_headers(shard_dir, self.manifest).items()}
        self._files = {name: file_identity(path) for name, path in self._paths.items()}  # what each process maps
        self.num_bins = self.manifest["num_bins"]
        self.pack_size = self.manifest["pack_size"]
        self._arrays: dict[str, np.ndarray] | None = None
        self._check_index()
        self._arrays = None  # NOTE: opened again lazily in whichever process reads

    def _open(self) -> dict[str, np.ndarray]:
        if self._arrays is None:
            if any(file_identity(path) != self._files[name] for name, path in self._paths.items()):  # mapped per process
                raise CacheMismatchError(f"{self.shard_dir}: its arrays were replaced since the dataset was opened "
                                         "(packed again?): open the dataset again")
            self._arrays = {name: _load(self._paths[name]) for name in ARRAYS}
        return self._arrays

    def _check_index(self) -> None:
        a = self._open()
        self._check_bins(a, a["seq_offsets"], a["packed_len"], self.shard_dir)
        # NOTE: the index arrays are read whole here anyway, so their checksums cost little (a start moved inside
        # its bin keeps every structural rule); the token and mask arrays are `validate`'s to hash.
        for name in INDEX_ARRAYS:
            self._check_sha256(name)

    def _check_sha256(self, name: str) -> None:
        rec = self.manifest["files"][name]
        if "sha256" in rec and sha256_file(self._paths[name]) != rec["sha256"]:
            raise FormatError(f"{self._paths[name]}: sha256 differs from {MANIFEST_NAME} (the array was "
                              "changed after packing); re-run `pack-sft`")

    def _check_bins(self, a: dict, off: np.ndarray, plen: np.ndarray, where: str) -> None:
        if int(off[0]) != 0 or int(off[-1]) != self.manifest["num_sequences"] or np.any(np.diff(off.astype(np.int64)) < 1):
            raise FormatError(f"{where}/seq_offsets.npy: must start at 0, increase by >= 1 per bin and end at "
                              f"num_sequences={self.manifest['num_sequences']}; re-run `pack-sft`")
        if int(plen.min(initial=1)) < 1 or int(plen.max(initial=0)) > self.pack_size:  # an empty shard has none
            raise FormatError(f"{where}/packed_len.npy: values must be in 1..{self.pack_size}, found "
                              f"{int(plen.min())}..{int(plen.max())}; re-run `pack-sft`")
        # seq_starts, vectorised: each bin's starts begin at 0, increase and stay below its packed length
        starts = np.asarray(a["seq_starts"], dtype=np.int64)
        bin_of = np.repeat(np.arange(self.num_bins), np.diff(off.astype(np.int64)))
        first = np.zeros(len(starts), dtype=bool)
        first[off[:-1].astype(np.int64)] = True
        bad = ((starts < 0) | (starts >= plen.astype(np.int64)[bin_of]) | (first & (starts != 0))
               | (~first & (np.diff(starts, prepend=0) <= 0)))
        if bad.any():
            k = int(np.argmax(bad))
            raise FormatError(f"{where}/seq_starts.npy: sequence {k} (bin {int(bin_of[k])}) starts at {int(starts[k])}; "
                              "each bin's starts must begin at 0, increase and stay below its packed_len: "
                              "re-run `pack-sft`")

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_arrays"] = None
        return state

    def fingerprint(self) -> str:
        """The identity of these bins in resume states: the manifest's size and sha256 of every array."""
        files = {name: {k: rec.get(k) for k in ("bytes", "sha256")} for name, rec in self.manifest["files"].items()}
        return fingerprint("memmap_padded", files, self.num_bins, self.pack_size)

    def __len__(self) -> int:
        return self.num_bins

    def __getitem__(self, idx: int) -> dict:
        idx = bin_index(idx, self.num_bins, self.shard_dir)
        a = self._open()
        n = int(a["packed_len"][idx])
        lo, hi = int(a["seq_offsets"][idx]), int(a["seq_offsets"][idx + 1])
        boundaries = np.empty(hi - lo + 1, dtype=np.int64)
        boundaries[:-1] = a["seq_starts"][lo:hi]
        boundaries[-1] = n
        return {"input_ids": np.array(a["input_ids"][idx, :n]),
                "loss_mask": np.array(a["loss_mask"][idx, :n]),
                "seq_boundaries": boundaries}

    def validate(self) -> None:
        """Read every byte: every array's sha256, the 0/1 mask, zeros in the padding and at sequence ends."""
        a = self._open()
        plen = a["packed_len"].astype(np.int64)
        off = a["seq_offsets"].astype(np.int64)
        for b0 in range(0, self.num_bins, VALIDATE_CHUNK_BINS):
            b1 = min(b0 + VALIDATE_CHUNK_BINS, self.num_bins)
            mask = np.array(a["loss_mask"][b0:b1])
            if mask.max(initial=0) > 1:
                raise FormatError(f"{self.shard_dir}/loss_mask.npy: values other than 0/1 in bins {b0}..{b1 - 1}")
            cols = np.arange(self.pack_size)
            if np.any(mask[cols[None, :] >= plen[b0:b1, None]]):
                raise FormatError(f"{self.shard_dir}/loss_mask.npy: nonzero mask in padding in bins {b0}..{b1 - 1}")
            for b in range(b0, b1):
                starts = np.asarray(a["seq_starts"][off[b]:off[b + 1]], dtype=np.int64)
                ends = np.append(starts[1:], plen[b]) - 1
                if np.any(mask[b - b0, ends]):
                    raise FormatError(f"{self.shard_dir} bin {b}: loss_mask is 1 at a sequence's last position "
                                      "(a target that crosses a sequence boundary)")
        # last: the structural checks above name what is wrong; the checksums catch the rest (a changed token)
        for name in ARRAYS:
            if name not in INDEX_ARRAYS:
                self._check_sha256(name)


def collate_packed(items: list[dict], *, pad_to: int | None = None, pad_id: int = 0) -> dict:
    """Batch packed bins for varlen attention (see the module docstring for the fields)."""
    import torch  # NOTE: here: the datasets, `inspect`, `verify` and `stats` run without torch (~1 s to import)

    lengths = [len(it["input_ids"]) for it in items]
    width = max(lengths) if pad_to is None else int(pad_to)
    if max(lengths) > width:
        raise FormatError(f"collate_packed: a bin of {max(lengths)} tokens does not fit pad_to={width}")
    bsz = len(items)
    ids = np.full((bsz, width), pad_id, dtype=np.int64)
    labels = np.full((bsz, width), IGNORE_INDEX, dtype=np.int64)
    mask = np.zeros((bsz, width), dtype=bool)
    pos = np.zeros((bsz, width), dtype=np.int64)
    seqlens = []
    for r, it in enumerate(items):
        n = lengths[r]
        bounds = np.asarray(it["seq_boundaries"], dtype=np.int64)
        ids[r, :n] = it["input_ids"]
        m = np.array(it["loss_mask"][:n], dtype=bool)
        m[bounds[1:] - 1] = False  # a sequence's last position predicts nothing (a foreign bin may say it does)
        mask[r, :n] = m
        target = np.flatnonzero(m)  # labels[j] = input_ids[j+1] where the mask says so
        labels[r, target] = ids[r, target + 1]
        seg = np.diff(bounds)
        pos[r, :n] = np.arange(n) - np.repeat(bounds[:-1], seg)
        seqlens.extend(seg.tolist())
        if width > n:
            pos[r, n:] = np.arange(width - n)
            seqlens.append(width - n)
    cu = np.cumsum([0, *seqlens], dtype=np.int32)
    return {"input_ids": torch.from_numpy(ids), "labels": torch.from_numpy(labels),
            "loss_mask": torch.from_numpy(mask), "position_ids": torch.from_numpy(pos),
            "cu_seqlens": torch.from_numpy(cu), "max_seqlen": int(max(seqlens))}


def _load(path: str) -> np.ndarray:
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError:  # NOTE: numpy cannot mmap a zero-byte payload (an empty shard's arrays)
        return np.load(path, allow_pickle=False)
