"""One door: what a path holds, decided once for `train`, `stats`, `inspect`, `verify` and `open_dataset`.

    found = locate("cache/mine")          # Found(kind="pretrain", root=cache/mine, split=None, meta={...})
    found = locate("cache/mine/val")      # Found(kind="pretrain", root=cache/mine, split="val", ...)

| the path holds                                               | kind             |
|--------------------------------------------------------------|------------------|
| our cache's meta.json (kind pretrain or sft), or a split dir  | `pretrain`, `sft` |
| a cache whose meta.json says "built": false (build-all's placeholder) | `not-built` |
| packed bins: manifest.json, Megatron-Bridge Parquet (`input_ids`), a legacy pickled `.npy` | `packed` (`layout` memmap, parquet, npy) |
| Parquet text shards (a `text` column)                         | `text-parquet`   |
| a mixture file (`.toml`, or `.json` holding `datasets`)       | `mixture`        |
| a tokenizer directory (meta.json of kind tokenizer)           | `tokenizer`      |
| a directory holding several outputs of ours (a build-all root) | `root`          |
| token files of another format (nanoGPT, KempnerForge, Megatron, raw with meta) | `foreign` (`info`: its FormatInfo) |

Anything else is an error saying what it is and what to do: missing (naming an interrupted build's
leftovers), token files without their commit marker, a text file (build it first), an empty or unrelated
directory. Markers are read by markers.by_marker (as the output guard does), peers' files by detect_format.
"""

from __future__ import annotations

import os
from pathlib import Path

from niels_gpt.constants import PARQUET_SUFFIXES, SPLITS
from niels_gpt.errors import FormatError, IncompleteCacheError
from niels_gpt.formats.detect import detect_format
from niels_gpt.formats.npy import read_npy_header
from niels_gpt.markers import (
    Found,
    by_marker,
    outputs_below,
    present,
    read_json,
    unfinished_message,
    unfinished_tokens,
)
from niels_gpt.meta import unfinished_build


def _parquet_columns(path: Path) -> list[str]:
    import pyarrow.parquet as pq  # lazy: pyarrow only for a Parquet directory

    try:
        return pq.read_schema(path).names
    except Exception as exc:  # noqa: BLE001 (pyarrow raises several kinds for a file that is not Parquet)
        raise FormatError(f"{path}: not a readable Parquet file ({type(exc).__name__}: {exc})") from None


def locate(path: str | os.PathLike) -> Found:
    """What `path` holds (the module's table), or a FormatError / IncompleteCacheError saying what to do."""
    p = Path(path)
    if not present(p):
        why = unfinished_build(p)
        if why is not None:
            raise IncompleteCacheError(why)
        raise FormatError(f"{p}: no such file or directory; check the path (build a cache with `build SRC... --out "
                          f"{p}`)")
    if p.is_file():
        return _file(p)
    found = by_marker(p)
    if found is not None:
        return found
    if p.is_dir():
        parquets = sorted(c for c in p.iterdir() if c.suffix in PARQUET_SUFFIXES)
        if parquets:
            names = _parquet_columns(parquets[0])
            if "input_ids" in names:
                return Found("packed", p, p, layout="parquet")
            if "text" in names:
                return Found("text-parquet", p, p)
            raise FormatError(f"{parquets[0]}: columns {names}: neither a 'text' column (text shards) nor "
                              "'input_ids' (packed SFT bins)")
        if outputs_below(p):
            return Found("root", p, p)
        why = unfinished_build(p)
        if why is None and (p.name in SPLITS):
            why = unfinished_build(p.parent)
        if why is not None:
            raise IncompleteCacheError(why)
    try:
        info = detect_format(p)
    except FormatError as exc:
        if unfinished_tokens(p) or (p.name in SPLITS and unfinished_tokens(p.parent)):
            raise IncompleteCacheError(unfinished_message(p)) from None
        if p.is_dir() and not any(p.iterdir()):
            raise FormatError(f"{p}: an empty directory, not a cache; build one into it with `build SRC... --out "
                              f"{p}`") from None
        raise FormatError(f"{p}: no meta.json, manifest.json, Parquet shards or token files of a known format here, "
                          "so not a cache, packed bins or a converted output; point at one (a cache is built with "
                          f"`build SRC... --out DIR`)") from exc
    return Found("foreign", p, p, None, {"format": info.format}, info=info)


def _pickled_npy(p: Path) -> bool:
    """Whether a .npy file holds Python objects (the legacy packed bins) rather than an array of token ids."""
    try:
        return read_npy_header(p, "point at packed bins or token files")[2].hasobject
    except OSError as exc:
        raise FormatError(f"{p}: not a readable .npy file ({exc}); point at packed bins or token files") from None


def _file(p: Path) -> Found:
    if p.suffix == ".toml":
        return Found("mixture", p, p.parent)
    if p.suffix == ".json":
        doc = read_json(p) or {}
        if "datasets" in doc:
            return Found("mixture", p, p.parent)
        if doc.get("kind") in ("pretrain", "sft", "tokenizer"):
            return locate(p.parent)
    if p.suffix in PARQUET_SUFFIXES:
        return Found("packed", p, p.parent, layout="parquet")
    if p.suffix == ".npy" and not p.name.endswith("_idx.npy") and _pickled_npy(p):
        return Found("packed", p, p.parent, layout="npy")
    info = detect_format(p)  # a text file is refused there, saying to build it first
    return Found("foreign", p, p.parent, None, {"format": info.format}, info=info)
