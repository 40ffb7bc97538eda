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

A path that holds none of these is a clear error saying what it is and what to do: missing (with the
interrupted build's leftovers named, when there are some: niels_gpt.meta.unfinished_build), our token files
without their commit marker (`unfinished_tokens`: a build that never finished, or a marker removed), a text
or JSONL file (build it first), an empty or unrelated directory.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from niels_gpt.constants import MANIFEST_NAME, META_NAME, SPLITS
from niels_gpt.errors import FormatError, IncompleteCacheError
from niels_gpt.formats.detect import detect_format
from niels_gpt.meta import unfinished_build

PARQUET = (".parquet", ".pq")
PACKED_LAYOUTS = ("memmap", "parquet", "npy")  # manifest.json directory, Megatron-Bridge Parquet, legacy pickle
TEXT_INPUTS = (".txt", ".md", ".raw", ".jsonl", ".json", ".gz", ".zst", ".csv", ".arrow")


@dataclass
class Found:
    kind: str
    path: Path  # as given
    root: Path  # the output's own directory (where its record lives)
    split: str | None = None  # a split directory was given
    meta: dict = field(default_factory=dict)
    layout: str | None = None  # packed bins: one of PACKED_LAYOUTS
    info: Any = None  # foreign: the FormatInfo of niels_gpt.formats.detect (its files, dtype, splits)


def _json(path: Path) -> dict | None:
    try:
        doc = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise FormatError(f"{path}: not readable JSON ({exc}); rebuild the output, or restore the file") from None
    return doc if isinstance(doc, dict) else None


def unfinished_tokens(d: Path) -> bool:
    """Whether directory `d` holds token files of ours (an SFT `*_tokens.bin`, pretraining shards under train/ or
    val/, packed `input_ids.npy`) but no commit marker (meta.json, manifest.json): a build that never finished,
    or an output whose marker was removed. The one rule behind locate, verify and stats."""
    d = Path(d)
    if not d.is_dir() or (d / META_NAME).is_file() or (d / MANIFEST_NAME).is_file():
        return False
    return (any(d.glob("*_tokens.bin")) or (d / "input_ids.npy").is_file()
            or any(any((d / split).glob("shard_*.bin*")) for split in SPLITS))


def unfinished_message(p: Path) -> str:
    """The one line for a directory `unfinished_tokens` finds (locate, verify and stats say it alike)."""
    return (f"{p}: token files but no {META_NAME} (or {MANIFEST_NAME}): unfinished build (its commit marker was "
            "never written, or was removed), so nothing here is read; build it again into a new directory, or "
            "remove this one and build again")


def _parquet_columns(path: Path) -> list[str]:
    import pyarrow.parquet as pq  # lazy: pyarrow only for a Parquet directory

    try:
        return pq.read_schema(path).names
    except Exception as exc:  # noqa: BLE001 (pyarrow raises several kinds for a file that is not Parquet)
        raise FormatError(f"{path}: not a readable Parquet file ({type(exc).__name__}: {exc})") from None


def present(p: Path) -> bool:
    """Whether `p` is there: a file, a directory, or a Megatron prefix (`p.bin` beside `p.idx`)."""
    return p.exists() or Path(str(p) + ".bin").exists()


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
    if p.is_dir() and (p / MANIFEST_NAME).is_file():
        return Found("packed", p, p, layout="memmap")
    for root, split in ((p, None), (p.parent, p.name)):
        if split is not None and split not in SPLITS:
            continue
        if (root / META_NAME).is_file():
            meta = _json(root / META_NAME) or {}
            kind = meta.get("kind")
            if kind in ("pretrain", "sft"):
                return Found("not-built" if meta.get("built") is False else kind, p, root, split, meta)
            if kind == "tokenizer" and split is None:
                return Found("tokenizer", p, root, None, meta)
    if p.is_dir():
        parquets = sorted(c for c in p.iterdir() if c.suffix in PARQUET)
        if parquets:
            names = _parquet_columns(parquets[0])
            if "input_ids" in names:
                return Found("packed", p, p, layout="parquet")
            if "text" in names:
                return Found("text-parquet", p, p)
            raise FormatError(f"{parquets[0]}: columns {names}: neither a 'text' column (text shards) nor "
                              "'input_ids' (packed SFT bins)")
        if any(p.glob(f"*/{META_NAME}")) or any(p.glob(f"*/*/{META_NAME}")) or any(p.glob(f"*/{MANIFEST_NAME}")):
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
    import numpy as np  # lazy: only for a .npy file

    try:
        with open(p, "rb") as f:
            fmt = np.lib.format
            read = fmt.read_array_header_1_0 if fmt.read_magic(f) == (1, 0) else fmt.read_array_header_2_0
            dtype = read(f)[2]
    except (OSError, ValueError) as exc:
        raise FormatError(f"{p}: not a readable .npy file ({exc}); point at packed bins or token files") from None
    return dtype.hasobject


def _file(p: Path) -> Found:
    if p.suffix in (".toml",):
        return Found("mixture", p, p.parent)
    if p.suffix == ".json":
        doc = _json(p) or {}
        if "datasets" in doc:
            return Found("mixture", p, p.parent)
        if doc.get("kind") in ("pretrain", "sft", "tokenizer"):
            return locate(p.parent)
    if p.suffix in PARQUET:
        return Found("packed", p, p.parent, layout="parquet")
    if p.suffix == ".npy" and not p.name.endswith("_idx.npy") and _pickled_npy(p):
        return Found("packed", p, p.parent, layout="npy")
    if p.suffix in TEXT_INPUTS or p.name.endswith(TEXT_INPUTS):
        raise FormatError(f"{p}: a text file, not a token cache: build one from it first (`build {p} --out "
                          "cache/NAME --tokenizer TOK`), then point at cache/NAME")
    info = detect_format(p)
    return Found("foreign", p, p.parent, None, {"format": info.format}, info=info)
