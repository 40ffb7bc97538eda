"""A reading plan: the inputs cut into ordered units of work; the stream of documents every reader of them sees.

    plan = plan_reading(["data/", "s3://bucket/more/*.parquet"])
    for item in stream_items(plan): ...   # str documents (or conversations) and Skipped(reason), in order

- The inputs (sources/inputs.py) are cut into pieces by the record-reader layer (sources/records.py); a task is
  one piece, a run of small whole text files of about `task_bytes`, or every piece of an input whose records
  group across pieces (oasst flat rows). Each input's layout is named (--format) or detected from its first record.
- The items of task 0, then task 1, ... are the stream, wherever each task runs, so a cache does not depend on
  where its tasks ran; a tokenizer trains on the same stream.
- `signatures` of every local input are taken when planning and checked before and after a task reads it and
  before the commit: an input rewritten while the build reads it is refused, never mixed into the cache.
Planning reads only metadata, a few bytes at each cut, Parquet/Arrow footers and each input's first record.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from itertools import islice

from niels_gpt.errors import ConfigError, SourceError
from niels_gpt.sources.base import portable
from niels_gpt.sources.documents import WHOLE_INPUT, Rules, check_layout, detect, items
from niels_gpt.sources.inputs import (
    PLAIN_TEXT,
    VAL_PIECE_CHARS,
    WHOLE_FILE,
    RemoteFile,
    check_unchanged_file,
    expand,
    signature,
)
from niels_gpt.sources.origins import Reading, located
from niels_gpt.sources.records import Piece, item_of, pieces, records
from niels_gpt.sources.text_io import BadRecord, FileText

PLAN_VERSION = 2
TASK_BYTES = 64 * 1024 * 1024  # the most input bytes a task covers by default (~15 M tokens of English)
MIN_TASK_BYTES = 4 * 1024 * 1024  # the least (~0.3 s of one core: a task's fixed costs stay below 1%)
TASKS_WANTED = 64  # by default the inputs are cut into about this many tasks (see auto_task_bytes)
SNIFF_BYTES = 1 << 16  # of a whole text file, to detect its layout (a Gutenberg header, a wikitext heading)
SPLIT_RULE_NONE = "none: the inputs in the order given; the builder splits"


@dataclass(kw_only=True)
class Task:
    """One unit of work: its pieces' records, read in order through one layout."""

    index: int
    pieces: list[dict]  # Piece.to_json() of each
    layout: str
    bytes: int = 0  # input bytes it covers (0 when unknown: a file at a URL, a dataset shard)
    id: str = ""  # given by a build (builders/plan.py), which names its receipts by it

    def where(self) -> str:
        first = Piece(**self.pieces[0]).where()
        return first if len(self.pieces) == 1 else f"{len(self.pieces)} inputs from {first}"

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(kw_only=True)
class Plan:
    tasks: list[Task]
    inputs: list[str]
    layouts: list[str]  # one per input
    rules: Rules
    chat: bool
    tokenizer_sha256: str = ""  # the build's tokenizer (builders/plan.py), "" when only read
    token_dtype: str = ""  # numpy dtype string, e.g. "<u2"
    tokenizer_options: dict = field(default_factory=dict)  # load_tokenizer's eos/bos/separator, where given
    config: str | None = None  # of a dataset id
    split: str = "train"
    task_bytes: int = TASK_BYTES  # what the plan was cut with (plan_reading resolves the default)
    streaming: bool = False
    signatures: dict = field(default_factory=dict)  # local input -> signature()
    sizes: dict = field(default_factory=dict)  # input -> bytes, where known (local files, most URLs)
    kinds: list = field(default_factory=list)  # one per input: the kind it is read as
    left_out: list = field(default_factory=list)  # {"path", "reason"} of each file under a source not read

    def input_bytes(self) -> int | None:
        """Total input bytes for a progress bar's ETA, when every input is an uncompressed text file of known size."""
        if any(k not in PLAIN_TEXT + (".jsonl", ".json") for k in self.kinds):
            return None
        return sum(self.sizes.values()) if len(self.sizes) == len(self.inputs) else None

    def describe(self) -> dict:
        """meta.json's `source`: the inputs and how they were read (not the tasks: their size changes nothing)."""
        ids = [i for i, lay in zip(self.inputs, self.layouts, strict=True) if lay == "dataset"]
        return {"name": "corpus", "files": [portable(p) for p in self.inputs],
                "layouts": sorted(set(self.layouts)), "dataset_id": ids[0] if ids else None,
                "dataset_config": self.config, "split": self.split, "streaming": self.streaming,
                "text_field": self.rules.text_field,
                **({"messages_field": self.rules.messages_field, "chat_columns": self.rules.chat_columns}
                   if self.chat else {}),
                "on_bad_record": self.rules.on_bad_record, "split_rule": SPLIT_RULE_NONE,
                **({"map": self.rules.map} if self.rules.map else {}),
                **({"min_chars": self.rules.min_chars} if self.rules.min_chars else {}),
                **({"val_per_input": VAL_PIECE_CHARS} if self.rules.val_per_input else {}),
                **({"skipped_inputs": list(self.left_out)} if self.left_out else {})}

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps([t.id for t in self.tasks]).encode()).hexdigest()

    def to_json(self) -> dict:
        return {"plan_version": PLAN_VERSION, "fingerprint": self.fingerprint(), "inputs": self.inputs,
                "layouts": self.layouts, "rules": self.rules._asdict(), "chat": self.chat,
                "tokenizer_sha256": self.tokenizer_sha256, "tokenizer_options": self.tokenizer_options,
                "token_dtype": self.token_dtype, "config": self.config, "split": self.split,
                "task_bytes": self.task_bytes, "tasks": [t.to_json() for t in self.tasks]}


def auto_task_bytes(total_bytes: int) -> int:
    """About TASKS_WANTED tasks, within [MIN_TASK_BYTES, TASK_BYTES]: many tasks keep every worker busy to the
    end and let the commit start early (docs/scale.md, "One build verb"). It depends on the inputs alone, so
    the plan and its task ids, and a resume, are the same however the build is run."""
    return max(MIN_TASK_BYTES, min(TASK_BYTES, -(-total_bytes // TASKS_WANTED)))


def _input_bytes(items) -> int:
    """The bytes of every input whose size is known without reading it: local files, files a URL listed."""
    total = 0
    for item in items:
        if isinstance(item, RemoteFile):
            total += item.size or 0
        elif not isinstance(item, str):  # a str is a dataset id: its size is not known before it is read
            with contextlib.suppress(OSError):  # planning names an unreadable input, with its fix
                total += os.stat(item).st_size
    return total


def plan_reading(sources: Sequence[str | os.PathLike], *, task_bytes: int | None = None,
              rules: Rules | None = None, chat: bool = False, layout: str | None = None, config: str | None = None,
              split: str = "train", read_as: dict[str, str] | None = None) -> Plan:
    """Cut `sources` (files, directories, globs, URLs, dataset ids) into tasks of about `task_bytes` input bytes
    (None: auto_task_bytes). `read_as`: suffix -> kind (--read-as); layout "text" reads unknown suffixes as text."""
    if task_bytes is not None and task_bytes < 1:
        raise ConfigError(f"task_bytes must be >= 1, got {task_bytes}")
    if not sources:
        raise ConfigError("no sources given: pass files, directories, globs, URLs or dataset ids")
    rules = rules or Rules()
    if layout is not None:
        check_layout(layout, chat)

    tasks: list[Task] = []
    names, layouts, signatures, sizes, kinds, left_out = [], [], {}, {}, [], []
    run: list[tuple[Piece, int]] = []  # small whole files waiting to fill a task
    run_layout = None

    def flush():
        nonlocal run, run_layout
        if run:
            tasks.append(Task(index=0, pieces=[p.to_json() for p, _ in run], layout=run_layout,
                              bytes=sum(n for _, n in run)))
        run, run_layout = [], None

    expanded = expand(sources, read_as=read_as, as_text=layout == "text", left_out=left_out)
    if task_bytes is None:
        task_bytes = auto_task_bytes(_input_bytes(expanded))
    for item in expanded:
        name, kind, remote = item_of(item)
        if not remote and kind != "dataset":
            signatures[name] = signature(name)
        ps = pieces(item, task_bytes, config=config, split=split)
        lay = _layout(ps[0], layout, chat, rules)
        names.append(name)
        kinds.append(kind)
        layouts.append("dataset" if kind == "dataset" else lay)
        size = signatures[name][0] if name in signatures else getattr(item, "size", None)
        if size is not None:
            sizes[name] = size
        size = size or 0
        if kind in WHOLE_FILE and not remote:
            if run and (run_layout != lay or sum(n for _, n in run) >= task_bytes):
                flush()
            run.append((ps[0], size))
            run_layout = lay
            continue
        flush()
        if lay in WHOLE_INPUT:
            if tasks and tasks[-1].layout == lay and tasks[-1].index == -1:  # flat rows group across inputs
                tasks[-1].pieces += [p.to_json() for p in ps]
                tasks[-1].bytes += size
            else:
                tasks.append(Task(index=-1, pieces=[p.to_json() for p in ps], layout=lay, bytes=size))
            continue
        for p in ps:
            tasks.append(Task(index=0, pieces=[p.to_json()], layout=lay,
                              bytes=(p.stop - p.start) if p.stop >= 0 and kind in (".jsonl", ".json")
                              else size // len(ps)))
    flush()
    for index, t in enumerate(tasks):
        t.index = index
    return Plan(tasks=tasks, inputs=names, layouts=layouts, rules=rules, chat=chat, config=config,
                split=split, task_bytes=task_bytes, streaming=any(lay == "dataset" for lay in layouts),
                signatures=signatures, sizes=sizes, kinds=kinds, left_out=left_out)


def _layout(first: Piece, named: str | None, chat: bool, rules: Rules) -> str:
    """Named, or detected from the first record, which fails the plan if unreadable (unless bad records skip)."""
    if named not in (None, "oasst", "text"):
        return named
    where, record = _first_record(first, chat)
    if record is None:
        return named or ("messages" if chat else "text")
    # --format oasst: trees or flat rows; a record of any other shape gets the tree reader's refusal naming it
    if named == "oasst" and isinstance(record, dict):
        try:
            return "oasst-rows" if detect(where, record, chat=True, rules=rules) == "oasst-rows" else named
        except SourceError:
            return named
    found = named if named == "text" else detect(where, record, chat=chat, rules=rules)
    if found == "text" and rules.on_bad_record == "error":
        if isinstance(record, BadRecord):
            raise SourceError(f"{record} (or pass --on-bad-record skip to skip and count such records)")
        if isinstance(record, dict) and rules.text_field not in record:
            raise SourceError(f"{where}: no {rules.text_field!r} field (fields: {sorted(record)}); pass --text-field "
                              "NAME, or --chat for conversations")
    return found


def _first_record(piece: Piece, chat: bool = False):
    """The first record of a piece (of a whole text file: its first SNIFF_BYTES), or (where, None) if empty. Of
    a local Parquet file's, for text, only the keys: its columns (detect() asks no more; no row is decoded)."""
    if piece.kind in PLAIN_TEXT and not piece.remote:
        with open(piece.item, "rb") as f:
            head = f.read(SNIFF_BYTES)
        return piece.item, FileText(head.decode("utf-8", errors="replace"))
    if piece.kind == ".parquet" and not chat and not piece.remote and piece.start <= 0:
        import pyarrow.parquet as pq

        with contextlib.suppress(Exception):  # an unreadable file: records() below names what is wrong
            meta = pq.ParquetFile(piece.item).metadata
            return (piece.item, None) if meta.num_rows == 0 else \
                (f"{piece.item}, row 0", dict.fromkeys(meta.schema.to_arrow_schema().names))
    try:
        return next(islice(records(piece), 1))
    except StopIteration:
        return piece.item, None


def task_items(task: Task, rules: Rules, signatures: dict | None = None, origins: bool = False) -> Iterator:
    """The task's documents or conversations in order, a Skipped per record that is neither; a local input whose
    signature changed is refused. `origins`: (item, origin) pairs, origin None for a Skipped, else (k, record,
    char_start, char_end), k the piece's index in the task (sources/origins.py)."""
    signatures = signatures or {}
    pieces = [Piece(**p) for p in task.pieces]
    at = Reading()

    def recs():
        for k, piece in enumerate(pieces):
            check_unchanged_file(piece.item, signatures.get(piece.item))
            if origins:
                for where, record in records(piece, _columns(task.layout, rules)):
                    at.read(k, where, record)
                    yield where, record
            else:
                yield from records(piece, _columns(task.layout, rules))
            check_unchanged_file(piece.item, signatures.get(piece.item))
        at.exhausted = True

    out = items(recs(), task.layout, rules)
    yield from located(out, at, task.layout, rules) if origins else out


def _columns(layout: str, rules: Rules) -> list[str] | None:
    """The columns a layout reads (of Parquet and Arrow inputs); None: every column."""
    return {"text": [rules.text_field], "messages": [rules.messages_field],
            "columns": list(rules.chat_columns or ())}.get(layout)


def stream_items(plan: Plan, check_at_end: bool = True) -> Iterator:
    """Every item of the plan in order: the stream a one-process build reads."""
    for t in plan.tasks:
        yield from task_items(t, plan.rules, plan.signatures)
    if check_at_end:
        check_unchanged(plan)


def check_unchanged(plan: Plan, read: Sequence[str] | None = None) -> None:
    """Refuse the build if a local input (of those `read`, default all) changed since it was planned."""
    for path in read if read is not None else plan.signatures:
        check_unchanged_file(path, plan.signatures[path])
