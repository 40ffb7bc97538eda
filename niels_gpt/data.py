"""One door: `open_dataset(path, T=...)` looks at what `path` holds and returns the dataset that serves it.

    from niels_gpt.data import open_dataset
    ds = open_dataset("cache-demo/pretrain/wikitext", T=256)      # IndexedWindowDataset, split train
    ds = open_dataset("cache-demo/sft/dolly15k", T=256)           # SFTExampleDataset
    ds = open_dataset("packed/", T=None)                          # PackedMemmapDataset
    ds = open_dataset("s3://bucket/cache/train", T=1024)          # IndexedWindowDataset, via a local mirror

| `path` holds                                                   | dataset                     | item / batch |
|----------------------------------------------------------------|-----------------------------|--------------|
| a pretraining cache (meta.json kind pretrain) or one split dir | `IndexedWindowDataset`      | `{"input_ids", "labels"}`, T tokens, stride T |
| an SFT cache (meta.json kind sft)                              | `SFTExampleDataset`         | `get_batch(B=...)` / `collate(indices)`: x, y, loss mask |
| packed bins (manifest.json, Megatron-Bridge Parquet, legacy .npy) | `open_packed`            | `{"input_ids", "labels", "loss_mask", "seq_starts"...}` |
| a peer's token files (`convert --to` output, nanoGPT .bin, KempnerForge .npy, Megatron .bin/.idx, raw) | `MemoryMappedDataset` | KempnerForge's semantics: `{"input_ids", "labels"}`, windows of T + 1, stride T + 1 |

Every dataset pickles as paths, validates its files on open and raises the package's errors (which to use
for what: docs/loading.md). A cache URL opens through the host's download cache: only its marker is read
here, shards come on first use (docs/storage.md). Peers' token files are read from local paths only.
"""

from __future__ import annotations

import os
from pathlib import Path

from niels_gpt.constants import META_NAME, SPLITS
from niels_gpt.errors import ConfigError, FormatError
from niels_gpt.formats.kempner_dataset import MemoryMappedDataset
from niels_gpt.loading.windows import IndexedWindowDataset
from niels_gpt.locate import locate
from niels_gpt.packing.dataset import PackedMemmapDataset
from niels_gpt.packing.factory import open_packed
from niels_gpt.readers.sft import SFTExampleDataset
from niels_gpt.storage.remote import open_marker
from niels_gpt.urls import is_url


def open_dataset(path: str | os.PathLike, *, T: int | None = None, split: str = "train", **options):
    """The dataset for whatever `path` holds (the module's table; niels_gpt.locate decides). `T`: the window
    length (packed bins take none: theirs is fixed at packing). `options` go to the dataset."""
    if is_url(path) and not os.fspath(path).startswith("file://"):
        rc, sub = open_marker(os.fspath(path))
        if sub and sub not in SPLITS:
            raise FormatError(f"{path}: {sub!r} is not a split of the cache at {rc.url} (expected "
                              f"{' or '.join(SPLITS)})")
        found = locate(rc.local_dir)  # the marker mirrored beside the download cache says what the URL holds
        found.split, where = sub or None, rc.url
    else:
        where = Path(os.fspath(path).removeprefix("file://"))
        found = locate(where)
        where = where if found.kind in ("packed", "foreign") else found.root
    if found.kind == "packed":
        if T is not None:
            raise ConfigError(f"{path}: packed bins have the length they were packed with; leave T out")
        return PackedMemmapDataset(where) if is_url(where) else open_packed(where, **options)
    if found.kind in ("pretrain", "sft", "foreign") and (not isinstance(T, int) or isinstance(T, bool) or T < 1):
        raise ConfigError(f"{path}: T={T!r}; pass the window length as a positive int (T=...)")
    split = found.split or split
    if found.kind in ("pretrain", "sft"):
        check_split(where, found.meta, split)
    if found.kind == "pretrain":
        return IndexedWindowDataset(where, T, split=split, **options)
    if found.kind == "sft":
        eot = (found.meta.get("special_token_ids") or {}).get("eot")
        if eot is None:
            raise FormatError(f"{where}/{META_NAME}: no special_token_ids.eot; rebuild the SFT cache")
        return SFTExampleDataset(f"{where}/{split}_tokens.bin", f"{where}/{split}_idx.npy", T=T,
                                 device=options.pop("device", "cpu"), eot_id=int(eot), **options)
    if found.kind == "foreign":
        return MemoryMappedDataset(where, T, split=split, **options)
    raise FormatError(f"{path}: {WHAT[found.kind]}, which holds no tokens to train on; point at a cache, packed bins "
                      "or token files")


def check_split(where, meta: dict, split: str) -> None:
    """Refuse a split the cache does not have (one it has files of), naming the ones it has and their tokens,
    and what to do instead."""
    files, totals = meta.get("files") or {}, meta.get("totals") or {}
    have = {s: int(totals.get(f"{s}_tokens", 0) or 0) for s in SPLITS
            if any(rel.startswith(f"{s}/") or rel == f"{s}_tokens.bin" for rel in files)}
    if split in have:
        return
    listed = ", ".join(f"{s} ({n:,} tokens)" for s, n in have.items()) or "no split with files"
    held_out = ("pass split='val' for its held-out part" if have.get("val") else
                "it has no held-out part: rebuild it with --val-tokens N or --val-frac F for a val split")
    raise ConfigError(f"{where}: no split {split!r}; this cache has {listed} (a cache holds train and val only): "
                      f"{held_out}; a test set of your own is a cache of its own: build it from its files (`build "
                      "FILES --out cache/NAME-test --tokenizer TOK`) and open its train split")


WHAT = {"tokenizer": "a tokenizer directory", "root": "a root of several outputs (open one of them)",
        "mixture": "a mixture file (train takes it; open its datasets one by one)",
        "text-parquet": "Parquet text shards (tokenized while training: ParquetTokenLoader)",
        "not-built": "a cache that was not built (its meta.json says why)"}

