"""Open packed SFT data in whichever layout it is stored (niels_gpt.locate says which).

| path                                   | dataset                                          |
|----------------------------------------|--------------------------------------------------|
| directory with manifest.json           | PackedMemmapDataset (memmap_padded_v1)          |
| .parquet / .pq file, or a directory of them (no manifest) | PackedParquetDataset (Megatron-Bridge) |
| .npy file of Python objects (pickle)   | LegacyPackedDataset, only with allow_pickle=True |
| list of any of these                   | PackedMultiShardDataset                          |

Each is map-style by protocol (`len(ds)`, `ds[i]`: a dict of numpy arrays), as a DataLoader takes it, and none
imports torch (only `collate_packed` does).
"""

from __future__ import annotations

import os

import numpy as np

from niels_gpt.constants import MANIFEST_NAME
from niels_gpt.errors import FormatError
from niels_gpt.locate import locate
from niels_gpt.packing.dataset import PackedMemmapDataset
from niels_gpt.packing.legacy import LegacyPackedDataset
from niels_gpt.packing.memmap_format import bin_index
from niels_gpt.packing.parquet import PackedParquetDataset
from niels_gpt.resume import dataset_fingerprint, fingerprint


def open_packed(path, *, allow_pickle: bool = False):
    """Return a map-style dataset of packed bins for `path` (see the table above)."""
    if isinstance(path, (list, tuple)):
        return PackedMultiShardDataset([open_packed(p, allow_pickle=allow_pickle) for p in path])
    found = locate(path)
    if found.kind != "packed":
        raise FormatError(f"{path}: holds {found.kind} data, not packed SFT bins (expected a directory with "
                          f"{MANIFEST_NAME}, a .parquet/.pq file or directory of them, or a legacy .npy); pack an SFT "
                          "cache first (`pack-sft CACHE OUT --seq-len N`)")
    if found.layout == "memmap":
        return PackedMemmapDataset(found.path)
    if found.layout == "parquet":
        return PackedParquetDataset(found.path)
    return LegacyPackedDataset(found.path, allow_pickle=allow_pickle)


class PackedMultiShardDataset:
    """Several packed datasets (shard directories or dataset objects) read as one, in the given order."""

    def __init__(self, shards):
        self.shards = [open_packed(s) if isinstance(s, (str, os.PathLike, list, tuple)) else s for s in shards]
        self.offsets = np.cumsum([0, *(len(s) for s in self.shards)], dtype=np.int64)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def fingerprint(self) -> str:
        """Its shards' fingerprints, in order (a shard without one is refused, as by the samplers)."""
        return fingerprint("packed_shards", [dataset_fingerprint(s) for s in self.shards])

    def __getitem__(self, idx: int) -> dict:
        idx = bin_index(idx, len(self), "multi-shard dataset")
        shard = int(np.searchsorted(self.offsets, idx, side="right")) - 1
        return self.shards[shard][idx - int(self.offsets[shard])]
