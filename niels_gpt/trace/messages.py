"""An OpenAssistant example's message ids, read again from the record its origin names.

A cache keeps an oasst example's record, not its ids: `conversation_ids` reads the tree from the input
(a tree export's line, or flat rows from the record on while they share its tree) and selects the
conversation with the build's rule (sources/oasst_trees.py). An input not at hand here gives no ids.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from pathlib import Path

from niels_gpt.errors import NielsGPTError
from niels_gpt.sources.base import SAMPLE_DIR, SAMPLE_PREFIX
from niels_gpt.sources.oasst_trees import best_path, flatten_tree

OASST_LAYOUTS = ("oasst", "oasst-rows")


def local_input(path: str) -> Path | None:
    """The file an origins input names, where it is a local, uncompressed file at hand (a bundled sample file
    named "sample:<path>" is the package's); None otherwise."""
    if path.startswith(SAMPLE_PREFIX):
        found = SAMPLE_DIR / path[len(SAMPLE_PREFIX):]
    elif "://" in path:
        return None
    else:
        found = Path(path)
    return found if found.is_file() and not found.name.endswith((".gz", ".zst")) else None


def _json_rows(path: Path, offset: int):
    with open(path, "rb") as f:
        f.seek(offset)
        for raw in f:
            if raw.strip():
                yield json.loads(raw)


@functools.lru_cache(maxsize=4)
def _parquet_rows(path: str, stamp: tuple) -> list[dict]:
    import pyarrow.parquet as pq  # lazy: only an oasst example from Parquet rows reads one

    cols = ["message_id", "parent_id", "message_tree_id", "role", "text", "deleted", "rank"]
    table = pq.read_table(path)
    return table.select([c for c in cols if c in table.column_names]).to_pylist()


def _tree_rows(path: Path, record: int, layout: str) -> list[dict]:
    if layout == "oasst":
        line = next(_json_rows(path, record))
        return flatten_tree(line, f"{path}, byte {record}")
    if path.suffix == ".parquet":
        st = path.stat()
        rows = iter(_parquet_rows(str(path), (st.st_mtime_ns, st.st_size))[record:])
    else:
        rows = _json_rows(path, record)
    first = next(rows)
    tree = [first]
    for row in rows:
        if row.get("message_tree_id") != first["message_tree_id"]:
            break
        tree.append(row)
    return tree


def conversation_ids(path: str, record: int, layout: str) -> dict | None:
    """{"message_tree_id", "message_ids"} of the oasst example whose origin is `record` of input `path` read with
    `layout`; None where the input is not at hand here or the record is no tree the build would read."""
    found = local_input(path)
    if layout not in OASST_LAYOUTS or found is None:
        return None
    try:
        rows = _tree_rows(found, record, layout)
        chosen = best_path(rows, Counter())
    except (OSError, ValueError, KeyError, TypeError, StopIteration, NielsGPTError):
        return None
    if not chosen:
        return None
    if chosen[-1].get("role") == "prompter":  # the build drops a trailing prompter message
        chosen = chosen[:-1]
    return {"message_tree_id": str(rows[0]["message_tree_id"]), "message_ids": [str(r["message_id"]) for r in chosen]}
