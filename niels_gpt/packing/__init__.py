"""Packed SFT: bin packing of SFT examples and the memmap_padded_v1 / packed Parquet formats.

    from niels_gpt.packing import pack_sft, open_packed, collate_packed
    pack_sft("cache/sft/dolly15k", "packed/dolly15k-train", pack_size=4096, algorithm="ffd")
    ds = open_packed("packed/dolly15k-train")          # memmap dir, packed Parquet, or legacy .npy
    loader = DataLoader(ds, batch_size=4, num_workers=4, collate_fn=collate_packed)
"""

from niels_gpt.lazy import lazy_names
from niels_gpt.spans import assistant_token_mask as assistant_token_mask

# NOTE: the names below are imported on first use (PEP 562): the datasets import torch (~1 s), and `pack-sft`
# with ffd or bfd needs none of it.
_HOMES = {
    "ALGORITHMS": "algorithms", "BinAssignment": "algorithms", "pack_lengths": "algorithms",
    "PackedMemmapDataset": "dataset", "collate_packed": "dataset", "PackedMultiShardDataset": "factory",
    "open_packed": "factory", "LegacyPackedDataset": "legacy", "convert_legacy_to_memmap": "legacy",
    "convert_to_memmap": "legacy", "shift_within_sequences": "memmap_format", "FORMAT_NAME": "memmap_format",
    "MemmapShardWriter": "memmap_format", "read_manifest": "memmap_format", "pack_sft": "pack",
    "PackedParquetDataset": "parquet", "write_packed_parquet": "parquet",
}
__all__ = sorted([*_HOMES, "assistant_token_mask"])
__getattr__, __dir__ = lazy_names(globals(), _HOMES)
