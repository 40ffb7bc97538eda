"""The legacy pickled packed-SFT .npy (NeMo / Megatron-Bridge GPTSFTPackedDataset), read only on request,
and the converter from any packed dataset to memmap_padded_v1.

Legacy layout: `np.save(path, [{"input_ids": [...], "loss_mask": [...], "seq_start_id": [...]}, ...],
allow_pickle=True)`, one dict per bin, the loss mask already shifted within each sequence. Loading it
unpickles arbitrary objects and holds every bin in memory, so `LegacyPackedDataset` needs `allow_pickle=True`
and warns even then: convert once (`convert_to_memmap`) and read the memmap shard.
"""

from __future__ import annotations

import warnings

import numpy as np

from niels_gpt.errors import ConfigError, FormatError
from niels_gpt.meta import sha256_file
from niels_gpt.packing.memmap_format import COLUMNS, MemmapShardWriter, bin_index, packed_item
from niels_gpt.staging import build_aside


class LegacyPickleWarning(UserWarning):
    """Reading a pickled .npy: only do this for files you made yourself."""


class LegacyPackedDataset:
    """A legacy pickled packed .npy, fully loaded (the format allows nothing lazier)."""

    def __init__(self, path, *, allow_pickle: bool = False):
        self.path = str(path)
        if not allow_pickle:
            raise ConfigError(
                f"{path}: a legacy packed .npy is a pickle, which can run code when loaded; pass "
                "allow_pickle=True (--allow-pickle) only for files you trust, or convert it once with "
                "convert_legacy_to_memmap"
            )
        warnings.warn(f"{path}: loading a pickled legacy packed .npy (allow_pickle=True); convert it to "
                      "memmap_padded_v1 to avoid pickle", LegacyPickleWarning, stacklevel=2)
        try:
            data = np.load(self.path, allow_pickle=True)
        except (OSError, ValueError, EOFError) as exc:
            raise FormatError(f"{path}: not a readable .npy file ({exc})") from exc
        if data.ndim != 1 or data.dtype != object:
            raise FormatError(f"{path}: expected a 1-D object array of dicts, got {data.dtype} {data.shape}")
        self._rows = data

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, idx: int) -> dict:
        idx = bin_index(idx, len(self), self.path)
        row, where = self._rows[idx], f"{self.path} row {idx}"
        if not isinstance(row, dict) or any(k not in row for k in COLUMNS):
            raise FormatError(f"{where}: expected a dict with keys {', '.join(COLUMNS)}")
        return packed_item(*(np.asarray(row[k]) for k in COLUMNS), where)

    def fingerprint(self) -> str:
        """The identity of these bins in resume states: the .npy file's sha256 (it is read whole anyway)."""
        return "legacy_packed:" + sha256_file(self.path)[:16]


def convert_to_memmap(dataset, out_dir, *, pack_size: int | None = None, **manifest_extra) -> dict:
    """Write any packed dataset as a memmap_padded_v1 shard, built aside and swapped in whole.

    Two passes over the items: sizes first (pack_size defaults to the longest bin), then the data. A mask
    that is 1 at a sequence's last position (a foreign bin may say so; nothing follows it in its sequence) is
    written 0 there, as `collate_packed` reads it; the manifest's `loss_mask_ends_cleared` counts them.
    """
    n = len(dataset)
    longest, nseq = 0, 0
    for i in range(n):
        it = dataset[i]
        longest = max(longest, len(it["input_ids"]))
        nseq += len(it["seq_boundaries"]) - 1
    pack_size = longest if pack_size is None else int(pack_size)
    if longest > pack_size:
        raise ConfigError(f"convert_to_memmap: a bin holds {longest} tokens, more than pack_size={pack_size}")
    with build_aside(out_dir, kind="packed", flag="out_dir") as stage, \
            MemmapShardWriter(stage, n, max(pack_size, 1), nseq) as writer:
        cleared = 0
        for i in range(n):
            it = dataset[i]
            mask, ends = np.array(it["loss_mask"], dtype=np.uint8), np.asarray(it["seq_boundaries"][1:]) - 1
            cleared += int(mask[ends].sum())
            mask[ends] = 0
            writer.write_bin(it["input_ids"], mask, it["seq_boundaries"][:-1])
        return writer.finalize(**manifest_extra, loss_mask_ends_cleared=cleared)


def convert_legacy_to_memmap(legacy_path, out_dir, *, allow_pickle: bool = False,
                             pack_size: int | None = None) -> dict:
    """Convert a legacy pickled packed .npy into a memmap_padded_v1 shard (needs allow_pickle=True)."""
    ds = LegacyPackedDataset(legacy_path, allow_pickle=allow_pickle)
    return convert_to_memmap(ds, out_dir, pack_size=pack_size, algorithm="converted",
                             source={"legacy_npy": str(legacy_path)})
