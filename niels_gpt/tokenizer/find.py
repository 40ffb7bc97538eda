"""The one rule for the tokenizer of a cache (train, stats, inspect and verify ask `tokenizer_of`):

1. `--tokenizer PATH` (explicit): refused when its sha256 is not the one meta.json records;
2. meta.json's `tokenizer.path` (a file, a directory or a tiktoken name, with its load options), if its
   sha256 is still the recorded one;
3. a `tokenizer/` directory in the cache's directory or up to LEVELS above it (build-all's layout) whose
   sha256 is the recorded one. A cache records `tokenizer.path` only where this rule would not find it.
None when nothing matches (no decoded text, no bits per byte).
"""

from __future__ import annotations

import os
from pathlib import Path

from niels_gpt.constants import META_NAME
from niels_gpt.errors import FormatError, NielsGPTError
from niels_gpt.markers import read_json
from niels_gpt.tokenizer import check_tokenizer_matches, load_tokenizer

LEVELS = 3


def _meta_of(path: Path) -> tuple[Path, dict] | None:
    """(directory, meta) of the cache `path` is or is a split of."""
    for d in (path, path.parent):
        try:
            meta = read_json(d / META_NAME)
        except FormatError:
            continue
        if meta is not None and meta.get("kind") in ("pretrain", "sft"):
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
    record = meta.get("tokenizer") if isinstance(meta.get("tokenizer"), dict) else {}
    candidates = [(record["path"], record.get("options") or {})] if record.get("path") else []
    above = [cache.resolve(), *cache.resolve().parents][:LEVELS + 1]
    candidates += [(d / "tokenizer", {}) for d in above if (d / "tokenizer" / META_NAME).is_file()]
    for where, options in candidates:
        try:
            tok = load_tokenizer(where, **options)
        except NielsGPTError:
            continue
        if tok.sha256 == meta.get("tokenizer_sha256"):
            return tok
    return None
