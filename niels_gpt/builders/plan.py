"""A build plan: the reading plan (sources/stream.py) with a stable id per task, for receipts.

- A task id is `<index>-<12 hex>`, hashing what the task reads (input, range, layout, record rules) and how
  it tokenizes (tokenizer sha256, options, dtype, chat); a receipt is reused only while the sha256 of the
  bytes it read (its `digests`) still matches.
- The items of task 0, then task 1, ... are the build's stream whichever executor runs it.
- `shuffle=(seed, buffer_size)`: each dataset id whose rows are documents is read as one piece,
  `load_dataset(id, streaming=True).shuffle(seed=seed, buffer_size=buffer_size)`, and the builder's torch
  buffer is not applied; a dataset whose documents span rows (wikitext, oasst) keeps its shards and buffer.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence

from niels_gpt.errors import ConfigError
from niels_gpt.sources.documents import WHOLE_INPUT, Rules
from niels_gpt.sources.records import Piece
from niels_gpt.sources.stream import PLAN_VERSION, Plan, Task, plan_reading


def make_plan(sources: Sequence[str | os.PathLike], *, tokenizer, task_bytes: int | None = None,
              rules: Rules | None = None, chat: bool = False, layout: str | None = None, config: str | None = None,
              split: str = "train", read_as: dict[str, str] | None = None,
              shuffle: tuple[int, int] | None = None) -> Plan:
    """The reading plan of `sources` with each task's id for `tokenizer` (None: for reading only);
    `task_bytes` None: sources/stream.py::auto_task_bytes; `shuffle`: see the module docstring."""
    plan = plan_reading(sources, task_bytes=task_bytes, rules=rules, chat=chat, layout=layout, config=config,
                        split=split, read_as=read_as)
    if shuffle is not None:
        _shuffle_datasets(plan, *shuffle)
    plan.tokenizer_sha256 = tokenizer.sha256 if tokenizer is not None else ""
    plan.token_dtype = tokenizer.token_dtype.str if tokenizer is not None else ""
    plan.tokenizer_options = dict(getattr(tokenizer, "options", {}))
    for t in plan.tasks:
        t.id = f"{t.index:05d}-{_task_hash(t, plan)}"
    return plan


def _shuffle_datasets(plan: Plan, seed: int, buffer_size: int) -> None:
    """Each dataset id's shard tasks replaced, where its first shard was, by one task reading the whole stream
    shuffled by `datasets` (a layout of WHOLE_INPUT keeps its shards)."""
    tasks: list[Task] = []
    done: set[str] = set()
    for t in plan.tasks:
        first = t.pieces[0]
        if first["kind"] != "dataset" or t.layout in WHOLE_INPUT:
            tasks.append(t)
            continue
        if first["item"] in done:
            continue
        done.add(first["item"])
        whole = Piece(item=first["item"], kind="dataset", config=first.get("config"), split=first.get("split"),
                      shuffle_seed=seed, shuffle_buffer=buffer_size)
        tasks.append(Task(index=0, pieces=[whole.to_json()], layout=t.layout))
    for index, t in enumerate(tasks):
        t.index = index
    plan.tasks = tasks


def shuffled_datasets(plan: Plan | None) -> list[dict]:
    """The pieces of `plan` that read a dataset id through `datasets`' shuffle."""
    return [p for t in (plan.tasks if plan is not None else ()) for p in t.pieces if p.get("shuffle_buffer")]


def shuffled_by_datasets(buffer_size: int | None, plan: Plan, val: Plan | None) -> bool:
    """Whether `datasets` shuffles the stream of a build of `plan` (and `val`, its val split's plan); a stream
    whose inputs would be shuffled some by `datasets` and some by the builder's torch buffer is refused."""
    shuffled = shuffled_datasets(plan) + shuffled_datasets(val)
    if not shuffled:
        return False
    hub = {p["item"] for p in shuffled}
    others = [i for p in (plan, val) if p is not None for i in p.inputs if i not in hub]
    if others:
        raise ConfigError(f"--shuffle-buffer {buffer_size}: dataset {sorted(hub)[0]} is shuffled by `datasets` "
                          f"(shuffle(seed, buffer_size)) and {others[0]} would be shuffled by the builder's torch "
                          "buffer; one stream takes one shuffle: build them as separate caches, or leave out "
                          "--shuffle-buffer")
    return True


def shuffled_record(piece: dict) -> str:
    """What an origin's `record` counts in a dataset read through `datasets`' shuffle (origins.json)."""
    return (f"row of the stream as shuffled by datasets, from 0: load_dataset({piece['item']!r}, "
            f"name={piece.get('config')!r}, split={piece.get('split')!r}, streaming=True).shuffle("
            f"seed={piece['shuffle_seed']}, buffer_size={piece['shuffle_buffer']})")


def _task_hash(t: Task, plan: Plan) -> str:
    rules = {k: v for k, v in plan.rules._asdict().items() if k not in ("map", "min_chars", "val_per_input") or v}  # set: hashed
    key = {"v": PLAN_VERSION, "pieces": t.pieces, "layout": t.layout, "rules": rules, "chat": plan.chat,
           "tokenizer": plan.tokenizer_sha256, "dtype": plan.token_dtype, "options": plan.tokenizer_options}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
