"""Self-checking JSON records: every record an output of ours carries (a cache's or a tokenizer's meta.json, a
packed directory's manifest.json, a converted output's niels_receipt.json) holds the sha256 of its own fields.

- Written form: `json.dumps(record, indent=2, sort_keys=True, ensure_ascii=False) + "\\n"`, UTF-8, plus the
  field `record_sha256`: the sha256 of the canonical form (keys sorted, no whitespace) of every other field.
- Check (`seal_problem`): the fields hash to `record_sha256` (any edited value) and the bytes are exactly
  their written form (whitespace, a dropped newline, `1.0` for `1.00`, an escape).
- A record without the field predates seals and is read as before; a key one character away from
  `record_sha256` is the field damaged, so a single changed byte cannot make a sealed record look old.
Cost: one JSON dump and one sha256 per write and open (a 1,000-shard meta.json: ~200 KB, under 5 ms).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

RECORD_SEAL = "record_sha256"


def record_digest(record: dict) -> str:
    """sha256 of the canonical form of every field of `record` but its seal."""
    body = {k: v for k, v in record.items() if k != RECORD_SEAL}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def written_form(record: dict) -> bytes:
    """The bytes a record of ours is written as (its seal included, when it has one)."""
    return (json.dumps(record, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


def sealed_bytes(record: dict) -> bytes:
    """The bytes of `record` with its seal: what every writer of a record of ours writes."""
    return written_form({**record, RECORD_SEAL: record_digest(record)})


def is_sealed(record: dict) -> bool:
    """Whether `record` carries a seal, or a damaged one (see the module docstring)."""
    return any(k == RECORD_SEAL or _one_off(k) for k in record)


def _one_off(key: str) -> bool:
    return len(key) == len(RECORD_SEAL) and sum(a != b for a, b in zip(key, RECORD_SEAL, strict=True)) == 1


def seal_problem(path: str | os.PathLike, data: bytes, record: dict, fix: str) -> str | None:
    """What is wrong with a record read from `data` at `path` against its own seal, or None (the seal holds,
    or the record was written before records carried one: `is_sealed` tells which)."""
    path = Path(path)
    if not is_sealed(record):
        return None
    if RECORD_SEAL not in record:
        damaged = next(k for k in record if _one_off(k))
        return f"{path}: its {RECORD_SEAL} field is damaged (read as {damaged!r}); the file changed after it was " \
               f"written: {fix}"
    if record[RECORD_SEAL] != record_digest(record):
        return (f"{path}: its fields do not hash to its {RECORD_SEAL} (a value was edited or damaged after it was "
                f"written): {fix}")
    if data != written_form(record):
        return (f"{path}: its fields hold but its bytes are not the form they were written in (whitespace, "
                f"layout or an escape changed after it was written): {fix}")
    return None
