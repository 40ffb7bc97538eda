"""A run pins the caches it opened (their content identity from meta.json) and checks them before each val
evaluation: a cache rebuilt meanwhile would be scored with the old tokenizer. Cost: a meta.json read each.
"""

from __future__ import annotations

import json
from pathlib import Path

from niels_gpt.constants import META_NAME
from niels_gpt.errors import CacheError
from niels_gpt.resume import fingerprint


def meta_of(cache) -> dict:
    """A cache's meta.json as it is, unchecked; {} where there is none to read."""
    try:
        meta = json.loads((Path(cache) / META_NAME).read_text("utf-8"))
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def recorded_sha(record: dict) -> str | None:
    """The tokenizer sha256 a meta.json (or packed bins' manifest source) records; None for none or all zeros."""
    sha = record.get("tokenizer_sha256")
    return sha if isinstance(sha, str) and sha.strip("0") else None


def content_id(cache: Path) -> str | None:
    """The identity of a cache's content from its meta.json; None where there is none to read."""
    meta = meta_of(cache)
    return fingerprint(meta.get("files"), meta.get("tokenizer_sha256"), meta.get("vocab_size")) if meta else None


def pin(caches) -> dict[Path, str]:
    """{cache: its content identity} of those `caches` that are caches (a meta.json beside their data)."""
    return {Path(c): cid for c in caches if (cid := content_id(Path(c))) is not None}


def check_pins(pins: dict[Path, str]) -> None:
    """CacheError naming the first pinned cache whose content is no longer what the run opened."""
    for cache, pinned in pins.items():
        if (now := content_id(cache)) != pinned:
            what = "is gone" if now is None else "was replaced (rebuilt with other data or another tokenizer)"
            raise CacheError(f"{cache}: {what} while this run trained on it; its val split is no longer the data "
                             "this run opened, so val bpb is not scored: rerun on the cache as it is now (a cache "
                             "a run reads is best rebuilt into another --out)")


def summary(caches) -> list[dict]:
    """What a checkpoint records of the caches its run read: enough to say what differs on a resume."""
    out = []
    for c in caches:
        meta = meta_of(c)
        files = meta.get("files")
        if not isinstance(files, dict):
            continue
        out.append({"cache": str(c), "compression": (meta.get("compression") or {}).get("codec"),
                    "tokenizer_sha256": meta.get("tokenizer_sha256"), "content": content_id(Path(c)),
                    "tokens": {k.removesuffix(".zst"): v.get("tokens") for k, v in sorted(files.items())
                               if isinstance(v, dict)}})
    return out


def what_differs(then: list[dict], now: list[dict]) -> str | None:
    """One phrase: how the caches a checkpoint's run read differ from those this run opened; None where the
    checkpoint records none, or where they hold the same content."""
    if not then:
        return None
    if len(then) != len(now):
        return f"the run read {len(then)} cache(s), this run opens {len(now)}"
    for a, b in zip(then, now, strict=True):
        where = f"the run read {a['cache']}, this run opens {b['cache']}"
        if a["tokenizer_sha256"] != b["tokenizer_sha256"]:
            return f"{where}: built with another tokenizer (sha256 {str(a['tokenizer_sha256'])[:12]}... vs " \
                   f"{str(b['tokenizer_sha256'])[:12]}...)"
        if a["tokens"] != b["tokens"]:
            return f"{where}: other shards or token counts ({sum(filter(None, a['tokens'].values())):,} vs " \
                   f"{sum(filter(None, b['tokens'].values())):,} tokens)"
        if a["compression"] != b["compression"]:
            return (f"{where}: the same shards and token counts, {a['compression'] or 'uncompressed'} there and "
                    f"{b['compression'] or 'uncompressed'} here; a resume state names its shards by the sha256 of "
                    "their bytes, which compression changes")
        if Path(a["cache"]).name != Path(b["cache"]).name:
            return (f"{where}: the same shards and token counts under another directory name; a resume state "
                    "names its cache by its directory's name: give the cache its name back")
    if all(a.get("content") is not None and a.get("content") == b.get("content") for a, b in zip(then, now,
                                                                                                strict=True)):
        return None  # the same content: what the loader refused is not the data
    return "the same shards and token counts, other token content (the shards' sha256 differ)"
