"""Open packed SFT data in whichever format it is stored, by looking at the path.

| path                                   | dataset                                          |
|----------------------------------------|--------------------------------------------------|
| directory with manifest.json           | PackedMemmapDataset (memmap_padded_v1)          |
| .parquet / .pq file, or a directory of them (no manifest) | PackedParquetDataset (Megatron-Bridge) |
| .npy file                              | LegacyPackedDataset, only with allow_pickle=True |
| list of any of these                   | PackedMultiShardDataset                          |
"""

from __future__ import annotations

from pathlib import Path

from niels_gpt.errors import FormatError
from niels_gpt.packing.memmap_format import MANIFEST_NAME, read_manifest
from niels_gpt.packing.parquet import PARQUET_SUFFIXES


def open_packed(path, *, allow_pickle: bool = False):
    """Return a map-style dataset of packed bins for `path` (see the table above)."""
    if isinstance(path, (list, tuple)):
        from niels_gpt.packing.dataset import PackedMultiShardDataset

        return PackedMultiShardDataset([open_packed(p, allow_pickle=allow_pickle) for p in path])
    p = Path(path)
    if p.is_dir():
        if (p / MANIFEST_NAME).is_file():
            from niels_gpt.packing.dataset import PackedMemmapDataset

            return PackedMemmapDataset(p)
        if any(c.suffix in PARQUET_SUFFIXES for c in p.iterdir()):
            from niels_gpt.packing.parquet import PackedParquetDataset

            return PackedParquetDataset(p)
        read_manifest(p)  # raises: names the missing manifest and the fix
    if p.suffix in PARQUET_SUFFIXES:
        from niels_gpt.packing.parquet import PackedParquetDataset

        return PackedParquetDataset(p)
    if p.suffix == ".npy":
        from niels_gpt.packing.legacy import LegacyPackedDataset

        return LegacyPackedDataset(p, allow_pickle=allow_pickle)
    raise FormatError(f"{path}: not a packed SFT dataset (expected a directory with {MANIFEST_NAME}, a "
                      ".parquet/.pq file or directory, or a legacy .npy)")
