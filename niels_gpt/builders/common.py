"""What the pretraining and SFT builders share: the fields every meta.json has, skip counts, the dtype, and
how a build starts in its staging directory."""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from pathlib import Path

import numpy as np

from niels_gpt.atomic import remove_stale_temporaries
from niels_gpt.meta import FORMAT_VERSION, META_NAME, meta_token_dtype, numpy_dtype, read_meta


def resolve_dtype(tokenizer, token_dtype: str | None) -> np.dtype:
    if token_dtype is None:
        return np.dtype(tokenizer.token_dtype)
    return numpy_dtype(token_dtype)


def start_build(out: Path, split_dirs: list[str]) -> None:
    """Uncommit any previous cache here (meta first), clear its token files and the temporaries of killed
    builds (`*.tmp-<pid>` of a process that no longer runs)."""
    out.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(out / META_NAME)
    for sub in split_dirs:
        d = out / sub
        d.mkdir(exist_ok=True)
        for old in d.glob("shard_*.bin"):
            old.unlink()


def all_skipped(own: Counter, source: dict | None) -> dict:
    """Records skipped by the builder and by the source (what it dropped while reading), by reason."""
    out = dict(own)
    for reason, n in ((source or {}).get("skipped") or {}).items():
        out[reason] = out.get(reason, 0) + int(n)
    return dict(sorted(out.items()))


def common_meta(tokenizer, dtype, seed, name, config, streaming, source, tokenizer_path: str | None = None) -> dict:
    """The fields every cache's meta.json has. `tokenizer_path`: where train, stats and inspect find the tokenizer
    again (tokenizer/find.py); `build` gives it when a `tokenizer/` directory above the cache would not."""
    described = tokenizer.describe()
    if tokenizer_path is not None:
        described["path"] = tokenizer_path
    left_out = {}
    if isinstance(source, dict) and source.get("skipped_inputs"):  # files under a source that were not read
        left_out = {"skipped_inputs": source["skipped_inputs"]}
        source = {k: v for k, v in source.items() if k != "skipped_inputs"}
    return {
        "format_version": FORMAT_VERSION,
        "built": True,
        "dataset_name": name,
        "dataset_config": config,
        "seed": seed,
        "token_dtype": meta_token_dtype(dtype),
        "tokenizer_sha256": tokenizer.sha256,
        "tokenizer": described,
        "vocab_size": len(tokenizer),
        "special_token_ids": dict(tokenizer.special_ids),
        "streaming": streaming,
        "source": source,
        "randomness": "torch.Generator only",
        **left_out,
    }


def summarize(out: Path, **facts) -> dict:
    meta = read_meta(str(out))
    totals = meta["totals"]
    tokens = totals["train_tokens"] + totals["val_tokens"]
    return {"kind": meta["kind"], "totals": totals, "tokens": tokens, "files": len(meta["files"]),
            "skipped": {k: v for k, v in (meta.get("skipped") or {}).items() if v},
            "skipped_inputs": meta.get("skipped_inputs") or [], **facts}

