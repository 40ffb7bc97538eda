"""Packed SFT: bin packing of SFT examples and the memmap_padded_v1 / packed Parquet formats.

    from niels_gpt.packing import pack_sft, open_packed, collate_packed
    pack_sft("cache/sft/dolly15k", "packed/dolly15k-train", pack_size=4096, algorithm="ffd")
    ds = open_packed("packed/dolly15k-train")          # memmap dir, packed Parquet, or legacy .npy
    loader = DataLoader(ds, batch_size=4, num_workers=4, collate_fn=collate_packed)
"""

from niels_gpt.packing.algorithms import ALGORITHMS, BinAssignment, pack_lengths
from niels_gpt.packing.dataset import PackedMemmapDataset, collate_packed
from niels_gpt.packing.factory import PackedMultiShardDataset, open_packed
from niels_gpt.packing.legacy import LegacyPackedDataset, convert_legacy_to_memmap, convert_to_memmap
from niels_gpt.packing.masks import shift_within_sequences
from niels_gpt.packing.memmap_format import FORMAT_NAME, MemmapShardWriter, read_manifest
from niels_gpt.packing.pack import pack_sft
from niels_gpt.packing.parquet import PackedParquetDataset, write_packed_parquet
from niels_gpt.spans import assistant_token_mask

__all__ = [
    "ALGORITHMS", "BinAssignment", "pack_lengths", "PackedMemmapDataset", "PackedMultiShardDataset",
    "collate_packed", "open_packed", "LegacyPackedDataset", "convert_legacy_to_memmap", "convert_to_memmap",
    "assistant_token_mask", "shift_within_sequences", "FORMAT_NAME", "MemmapShardWriter", "read_manifest",
    "pack_sft", "PackedParquetDataset", "write_packed_parquet",
]
