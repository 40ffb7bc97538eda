"""A run pins the caches it opened: what their meta.json records when the run starts, checked again before
each val bpb evaluation.

Training reads shards it mapped at the start, so a `build` that replaces a cache meanwhile (other data,
another tokenizer) does not change what the steps see; the val split, opened at each evaluation, would be
the new cache's, scored with the old tokenizer's byte lengths. The pin is the content's identity (each
file's sha256, the tokenizer's sha256 and the vocabulary, as meta.json records them; a cache moved or
rebuilt byte for byte still matches). Cost: one read of each meta.json per evaluation.
"""

from __future__ import annotations

import json
from pathlib import Path

from niels_gpt.errors import CacheError
from niels_gpt.resume import fingerprint


def content_id(cache: Path) -> str | None:
    """The identity of a cache's content from its meta.json; None where there is none to read."""
    try:
        meta = json.loads((Path(cache) / "meta.json").read_text("utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict):
        return None
    return fingerprint(meta.get("files"), meta.get("tokenizer_sha256"), meta.get("vocab_size"))


def pin(caches) -> dict[Path, str]:
    """{cache: its content identity} of those `caches` that are caches (a meta.json beside their data)."""
    return {Path(c): cid for c in caches if (cid := content_id(Path(c))) is not None}


def check_pins(pins: dict[Path, str]) -> None:
    """CacheError naming the first pinned cache whose content is no longer what the run opened."""
    for cache, pinned in pins.items():
        now = content_id(cache)
        if now != pinned:
            what = "is gone" if now is None else "was replaced (rebuilt with other data or another tokenizer)"
            raise CacheError(f"{cache}: {what} while this run trained on it; its val split is no longer the data "
                             "this run opened, so val bpb is not scored: rerun on the cache as it is now (a cache "
                             "a run reads is best rebuilt into another --out)")
