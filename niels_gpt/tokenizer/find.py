"""The one rule for the tokenizer of a cache: what its meta.json records, then a `tokenizer/` directory above it.

    tok = tokenizer_of("cache/mine")          # train, stats, inspect and verify all ask this
    tok = tokenizer_of("cache/mine/train", explicit="tok/")   # --tokenizer: must be the one the cache records

1. `--tokenizer PATH` (explicit): loaded, and refused when its sha256 is not the one meta.json records;
2. the tokenizer meta.json records: `tokenizer.path` (a file, a directory, or a tiktoken encoding name, with
   the conventions it was loaded with), used when its sha256 is still the recorded one;
3. a `tokenizer/` directory in the cache's directory or up to LEVELS above it (build-all's layout, and
   `build --train-tokenizer`'s), whose sha256 is the recorded one.
None when nothing matches (the callers say what that costs: no decoded text, no bits per byte).
A cache records `tokenizer.path` only when rule 3 would not find its tokenizer, so caches of build-all keep
their bytes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from niels_gpt.constants import META_NAME
from niels_gpt.errors import NielsGPTError
from niels_gpt.tokenizer import check_tokenizer_matches, load_tokenizer

LEVELS = 3


def _meta_of(path: Path) -> tuple[Path, dict] | None:
    """(directory, meta) of the cache `path` is or is a split of."""
    for d in (path, path.parent):
        try:
            meta = json.loads((d / META_NAME).read_text("utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(meta, dict) and meta.get("kind") in ("pretrain", "sft"):
            return d, meta
    return None


def recorded_path(tokenizer, cache_dir: str | os.PathLike) -> str | None:
    """What a cache's meta.json should record as its tokenizer's path: None when `tokenizer/` above the
    cache is that tokenizer (rule 3 finds it), else an absolute path, or the name of a tiktoken encoding."""
    model = Path(str(tokenizer.model_path))
    if not model.exists():
        return str(tokenizer.model_path)  # a name: cl100k_base
    home = model.resolve() if model.is_dir() else model.resolve().parent
    for parent in [Path(cache_dir).resolve(), *Path(cache_dir).resolve().parents][:LEVELS + 1]:
        if (parent / "tokenizer").resolve() == home:
            return None
    return str(model.resolve())


def tokenizer_of(path: str | os.PathLike, explicit: str | os.PathLike | None = None):
    """The tokenizer of the cache at `path` (its directory or a split of it) by the module's rule, or None."""
    found = _meta_of(Path(path))
    if explicit is not None:
        tok = load_tokenizer(explicit)
        if found is not None:
            check_tokenizer_matches(tok, found[1].get("tokenizer_sha256"), found[0])
        return tok
    if found is None:
        return None
    cache, meta = found
    sha = meta.get("tokenizer_sha256")
    record = meta.get("tokenizer") if isinstance(meta.get("tokenizer"), dict) else {}
    if record.get("path"):
        try:
            tok = load_tokenizer(record["path"], **(record.get("options") or {}))
        except NielsGPTError:
            tok = None
        if tok is not None and tok.sha256 == sha:
            return tok
    for parent in [cache.resolve(), *cache.resolve().parents][:LEVELS + 1]:
        cand = parent / "tokenizer"
        if (cand / META_NAME).is_file():
            try:
                tok = load_tokenizer(cand)
            except NielsGPTError:
                continue
            if tok.sha256 == sha:
                return tok
    return None
