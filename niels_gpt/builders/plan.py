"""A build plan: the reading plan (sources/stream.py) with a stable id per task, for receipts.

- A task id is `<index>-<12 hex>`: the hash covers what the task reads (input, range, layout, the record
  rules), how it tokenizes (the tokenizer's sha256, its conventions, the token dtype) and whether it
  renders chats; not sizes or times: a receipt is reused only when the sha256 of the bytes it read (its
  `digests`, checked again on resume) still matches, so an input edited with its size and mtime kept is
  read again.
- The items of task 0, then task 1, ... are the build's stream, whichever executor runs it: `inline` reads
  them in order in the calling process, `processes` and `ray` have each task tokenized elsewhere and commit
  the parts in plan order (builders/commit.py). So the cache does not depend on the executor.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence

from niels_gpt.confine import confined
from niels_gpt.errors import CacheError
from niels_gpt.sources.documents import Rules
from niels_gpt.sources.stream import PLAN_VERSION, Plan, Task, plan_reading

TASK_ID = r"[0-9]{5}-[0-9a-f]{12}"  # <index>-<12 hex>: the name of a task's parts and receipt in the work directory


def make_plan(sources: Sequence[str | os.PathLike], *, tokenizer, task_bytes: int | None = None,
              rules: Rules | None = None, chat: bool = False, layout: str | None = None, config: str | None = None,
              split: str = "train", read_as: dict[str, str] | None = None) -> Plan:
    """The reading plan of `sources` with each task's id for `tokenizer` (None: ids for reading only); `task_bytes`
    None: the default size for these inputs (sources/stream.py::auto_task_bytes)."""
    plan = plan_reading(sources, task_bytes=task_bytes, rules=rules, chat=chat, layout=layout, config=config,
                        split=split, read_as=read_as)
    plan.tokenizer_sha256 = tokenizer.sha256 if tokenizer is not None else ""
    plan.token_dtype = tokenizer.token_dtype.str if tokenizer is not None else ""
    plan.tokenizer_options = dict(getattr(tokenizer, "options", {}))
    for t in plan.tasks:
        t.id = f"{t.index:05d}-{_task_hash(t, plan)}"
    return plan


def _task_hash(t: Task, plan: Plan) -> str:
    rules = {k: v for k, v in plan.rules._asdict().items() if k not in ("map", "min_chars", "val_per_input") or v}  # set: hashed
    key = {"v": PLAN_VERSION, "pieces": t.pieces, "layout": t.layout, "rules": rules, "chat": plan.chat,
           "tokenizer": plan.tokenizer_sha256, "dtype": plan.token_dtype, "options": plan.tokenizer_options}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def task_id(value, record, field: str = "id") -> str:
    """A task id read from a record (a plan, a task's receipt), checked before it names a file (niels_gpt/confine.py)."""
    return confined(value, record, field, parts=1, pattern=TASK_ID, error=CacheError,
                    fix="remove the work directory's plan.json and parts, then build again")


def read_plan(path: str | os.PathLike) -> dict:
    """A plan.json of a work directory, its task ids checked; CacheError naming the file otherwise."""
    try:
        doc = json.loads(open(path, "rb").read().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CacheError(f"{path}: not valid JSON ({exc}); remove it and build again") from exc
    tasks = doc.get("tasks") if isinstance(doc, dict) else None
    if not isinstance(tasks, list) or not all(isinstance(t, dict) for t in tasks):
        raise CacheError(f"{path}: 'tasks' is missing or not a list of objects; remove it and build again")
    for k, t in enumerate(tasks):
        task_id(t.get("id"), path, f"tasks[{k}].id")
    return doc
