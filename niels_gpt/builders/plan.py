"""A build plan: the inputs cut into ordered tasks, each with a stable id, and how a task reads its documents.

- inputs are local files (or directories of them) and Hugging Face dataset shards; the plan keeps
  their order, so the documents of task 0, then task 1, ... are exactly the stream the local builder
  would read (`plan_documents`);
- .jsonl/.json files are cut at line boundaries into ceil(size / task_bytes) byte ranges of about equal
  size (no small last task); .parquet files into runs of whole row groups; .txt/.raw files (one document
  per file) are grouped into runs of about `task_bytes`; a `datasets` stream gives one task per shard (`IterableDataset.shard`);
- a task id is `<index>-<12 hex>`: the hash covers the input (absolute path, size, mtime), the range,
  the text field, the tokenizer's sha256, the conventions it was loaded with (--eos/--bos/--separator,
  where given) and the token dtype, so a receipt from another plan, another tokenizer, another document
  separator or a changed file never passes for this task's;
- a record that cannot be used (bad JSON, bad UTF-8, a missing or non-text field) is a SourceError
  naming the file, the byte offset or row, and the fix. A document that is null or whitespace is
  passed on as "" and skipped (and counted) by the commit, as the local builder skips it.
Planning reads only file metadata: the size, a few bytes at each cut, Parquet footers.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from niels_gpt.errors import ConfigError, SourceError
from niels_gpt.sources.base import (
    BUILDERS,
    check_field,
    files_under,
    invalid_utf8_error,
    iter_rows,
    open_stream,
    portable,
    read_text_file,
)

TASK_BYTES = 64 * 1024 * 1024  # input bytes per task (~15 M tokens of English at ~4.3 bytes a token)
TEXT_FIELD = "text"
PLAN_VERSION = 1


@dataclass(kw_only=True)
class Task:
    """One unit of work: documents [start, stop) of one input, in the plan's order."""

    index: int
    kind: str  # "jsonl" (byte range), "parquet" (row groups), "text_files" (files), "hf_shard" (shard index)
    paths: list[str]
    start: int = 0
    stop: int = 0
    bytes: int = 0  # input bytes it covers (0 when unknown: a hub shard)
    hf: dict | None = None  # load_dataset arguments of an "hf_shard" task
    id: str = ""

    def where(self) -> str:
        if self.kind == "jsonl":
            return f"{self.paths[0]} bytes {self.start}-{self.stop}"
        if self.kind == "parquet":
            return f"{self.paths[0]} row groups {self.start}-{self.stop - 1}"
        if self.kind == "hf_shard":
            return f"{self.hf['path']} shard {self.start} of {self.stop}"
        return f"{len(self.paths)} file(s) from {self.paths[0]}"

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(kw_only=True)
class Plan:
    tasks: list[Task]
    inputs: list[str]
    text_field: str
    tokenizer_sha256: str
    token_dtype: str  # numpy dtype string, e.g. "<u2"
    tokenizer_options: dict = field(default_factory=dict)  # load_tokenizer's eos/bos/separator, where given
    hf: dict | None = None
    task_bytes: int = TASK_BYTES
    streaming: bool = False
    extra: dict = field(default_factory=dict)

    def describe(self) -> dict:
        """meta.json's `source`: what was read. It names the inputs, not the tasks, so the same inputs
        cut into tasks of another size give the same cache."""
        return {"name": "files" if self.hf is None else "hf_dataset",
                "inputs": [portable(p) for p in self.inputs], "hf": self.hf, "text_field": self.text_field,
                "streaming": self.streaming, "split_rule": "none: inputs in the given order; the pretrain "
                "cache builder splits by token budget"}

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps([t.id for t in self.tasks]).encode()).hexdigest()

    def to_json(self) -> dict:
        return {"plan_version": PLAN_VERSION, "fingerprint": self.fingerprint(), "inputs": self.inputs,
                "text_field": self.text_field, "tokenizer_sha256": self.tokenizer_sha256,
                "tokenizer_options": self.tokenizer_options, "token_dtype": self.token_dtype, "hf": self.hf, "task_bytes": self.task_bytes,
                "tasks": [t.to_json() for t in self.tasks]}


def expand_inputs(inputs: Sequence[str | os.PathLike]) -> list[Path]:
    """Files in order; a directory stands for its files of known kinds, sorted by relative path."""
    if not inputs:
        raise ConfigError("no inputs: pass files or directories (.jsonl, .json, .parquet, .txt, .raw) "
                          "or --hf-dataset")
    out: list[Path] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            found = files_under(p, lambda f: f.suffix.lower() in BUILDERS)
            if not found:
                raise SourceError(f"{p}: no {sorted(BUILDERS)} files in this directory; is it the right one?")
            out.extend(found)
        elif p.is_file():
            if p.suffix.lower() not in BUILDERS:
                raise ConfigError(f"{p}: unsupported file type {p.suffix!r}; use one of {sorted(BUILDERS)}")
            out.append(p)
        else:
            raise SourceError(f"{p}: no such file or directory; check the path")
    return [f.resolve() for f in out]


def make_plan(inputs: Sequence[str | os.PathLike] = (), *, tokenizer, task_bytes: int = TASK_BYTES,
              text_field: str = TEXT_FIELD, hf: dict | None = None) -> Plan:
    """Cut `inputs` (or the `datasets` stream `hf`: load_dataset keyword arguments) into tasks."""
    if task_bytes < 1:
        raise ConfigError(f"task_bytes must be >= 1, got {task_bytes}")
    tasks: list[Task] = []
    if hf is not None:
        if inputs:
            raise ConfigError("pass either input files or --hf-dataset, not both")
        tasks = _hf_tasks(hf)
        files: list[Path] = []
    else:
        files = expand_inputs(inputs)
        i = 0
        while i < len(files):
            kind = BUILDERS[files[i].suffix.lower()]
            if kind == "text":
                j = i
                while j < len(files) and BUILDERS[files[j].suffix.lower()] == "text":
                    j += 1
                tasks += _text_tasks(files[i:j], task_bytes)
                i = j
                continue
            tasks += _parquet_tasks(files[i], task_bytes, text_field) if kind == "parquet" \
                else _jsonl_tasks(files[i], task_bytes)
            i += 1
    dtype = tokenizer.token_dtype.str
    options = dict(getattr(tokenizer, "options", {}))
    for index, t in enumerate(tasks):
        t.index = index
        t.id = f"{index:05d}-{_task_hash(t, text_field, tokenizer.sha256, dtype, options)}"
    return Plan(tasks=tasks, inputs=[str(f) for f in files], text_field=text_field,
                tokenizer_sha256=tokenizer.sha256, tokenizer_options=options, token_dtype=dtype, hf=hf, task_bytes=task_bytes,
                streaming=hf is not None and not _all_local(hf))


def _task_hash(t: Task, text_field: str, tokenizer_sha: str, dtype: str, options: dict) -> str:
    stats = []
    local = list(t.paths)
    if t.hf is not None and t.hf.get("data_files"):
        files = t.hf["data_files"]
        local += [files] if isinstance(files, str) else [f for f in files if isinstance(f, str)]
    for p in local:
        with_stat = Path(p)
        if with_stat.exists():
            st = with_stat.stat()
            stats.append([p, st.st_size, st.st_mtime_ns])
        else:
            stats.append([p, None, None])
    key = {"v": PLAN_VERSION, "kind": t.kind, "files": stats, "start": t.start, "stop": t.stop, "hf": t.hf,
           "text_field": text_field, "tokenizer": tokenizer_sha, "dtype": dtype}
    if options:  # only where given, so the ids of a plan with the tokenizer's defaults stay as they were
        key["tokenizer_options"] = options
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def _jsonl_tasks(path: Path, task_bytes: int) -> list[Task]:
    """Ranges of about equal size, each about `task_bytes` at most: ceil(size / task_bytes) of them, the
    i-th cut just after the first newline at or past i/n of the file. Equal ranges leave no small last
    task, so workers that take them two by two finish together."""
    size = path.stat().st_size
    n = -(-size // task_bytes)
    cuts = [0]
    with open(path, "rb") as f:
        for i in range(1, n):
            f.seek(max(i * size // n, cuts[-1] + 1) - 1)
            pos = f.tell()
            while True:  # the cut goes just after the next newline
                chunk = f.read(1 << 16)
                if not chunk:
                    pos = size
                    break
                nl = chunk.find(b"\n")
                if nl >= 0:
                    pos += nl + 1
                    break
                pos += len(chunk)
            if pos >= size:
                break
            cuts.append(pos)
    cuts.append(size)
    return [Task(index=0, kind="jsonl", paths=[str(path)], start=a, stop=b, bytes=b - a)
            for a, b in zip(cuts, cuts[1:], strict=False) if b > a]


def _parquet_tasks(path: Path, task_bytes: int, text_field: str) -> list[Task]:
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(path).metadata
    except Exception as e:  # pyarrow raises several kinds for a file that is not Parquet
        raise SourceError(f"{path}: not a readable Parquet file ({type(e).__name__}: {e}); check the file") from e
    names = meta.schema.to_arrow_schema().names
    if text_field not in names:
        raise SourceError(f"{path}: no {text_field!r} column (columns: {names}); pass --text-field")
    tasks, start, acc = [], 0, 0
    for g in range(meta.num_row_groups):
        acc += meta.row_group(g).total_byte_size
        if acc >= task_bytes or g == meta.num_row_groups - 1:
            tasks.append(Task(index=0, kind="parquet", paths=[str(path)], start=start, stop=g + 1, bytes=acc))
            start, acc = g + 1, 0
    return tasks


def _text_tasks(paths: list[Path], task_bytes: int) -> list[Task]:
    tasks, run, acc = [], [], 0
    for p in paths:
        run.append(str(p))
        acc += p.stat().st_size
        if acc >= task_bytes:
            tasks.append(Task(index=0, kind="text_files", paths=run, bytes=acc, stop=len(run)))
            run, acc = [], 0
    if run:
        tasks.append(Task(index=0, kind="text_files", paths=run, bytes=acc, stop=len(run)))
    return tasks


def _all_local(hf: dict) -> bool:
    return hf.get("data_files") is not None


def _hf_stream(hf: dict):
    kwargs = {k: v for k, v in hf.items() if k != "path" and v is not None}
    return open_stream(hf["path"], f"dataset {hf['path']}", streaming=True, **kwargs)


def _hf_tasks(hf: dict) -> list[Task]:
    hf = {**hf, "split": hf.get("split") or "train"}
    n = _hf_stream(hf).num_shards
    return [Task(index=0, kind="hf_shard", paths=[], start=i, stop=n, hf=hf) for i in range(n)]


# ---------------------------------------------------------------------------------------------
# Reading a task's documents


def task_documents(task: Task, text_field: str) -> Iterator[str]:
    """The task's documents in order; null or whitespace-only ones come as "" (the commit skips them)."""
    if task.kind == "jsonl":
        yield from _jsonl_documents(Path(task.paths[0]), task.start, task.stop, text_field)
    elif task.kind == "parquet":
        yield from _parquet_documents(Path(task.paths[0]), task.start, task.stop, text_field)
    elif task.kind == "text_files":
        for p in task.paths:
            yield read_text_file(Path(p))
    elif task.kind == "hf_shard":
        yield from _hf_documents(task, text_field)
    else:
        raise ConfigError(f"task {task.id}: unknown kind {task.kind!r}; the plan was written by another version")


def _as_text(value, record, text_field: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise SourceError(f"{record}: field {text_field!r} is {type(value).__name__}, not text; point "
                          "--text-field at a string field or fix the record")
    return value


def _jsonl_documents(path: Path, start: int, stop: int, text_field: str) -> Iterator[str]:
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(stop - start)
    pos = 0
    while pos < len(data):
        end = data.find(b"\n", pos)
        end = len(data) if end < 0 else end
        raw = data[pos:end]
        offset = start + pos
        pos = end + 1
        if not raw.strip():
            continue  # a blank line is no record
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise invalid_utf8_error(path, offset + e.start, line=_line_number(path, offset),
                                     reason=e.reason) from e
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise SourceError(f"{_record(path, offset)}: not valid JSON ({e.msg} at column {e.colno}); fix or "
                              "remove this line") from e
        if not isinstance(row, dict):
            raise SourceError(f"{_record(path, offset)}: expected a JSON object per line, got {type(row).__name__}")
        if text_field not in row:
            check_field(row, text_field, _record(path, offset))
        yield _as_text(row[text_field], LazyRecord(path, offset), text_field)


def _line_number(path: Path, offset: int) -> int:
    """1-based number of the line that starts at byte `offset` (counted only when an error names it)."""
    newlines = 0
    with open(path, "rb") as f:
        remaining = offset
        while remaining > 0:
            chunk = f.read(min(remaining, 1 << 24))
            if not chunk:
                break
            newlines += chunk.count(b"\n")
            remaining -= len(chunk)
    return newlines + 1


def _record(path: Path, offset: int) -> str:
    return f"{path}, line {_line_number(path, offset)}"


class LazyRecord:
    """A record's name, formatted (line counted) only if an error message uses it."""

    def __init__(self, path: Path, offset: int):
        self.path, self.offset = path, offset

    def __str__(self) -> str:
        return _record(self.path, self.offset)


def _parquet_documents(path: Path, start: int, stop: int, text_field: str) -> Iterator[str]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    row0 = sum(pf.metadata.row_group(g).num_rows for g in range(start))
    for g in range(start, stop):
        try:
            column = pf.read_row_group(g, columns=[text_field]).column(text_field)
            values = column.to_pylist()
        except UnicodeDecodeError as e:
            raise invalid_utf8_error(path, e.start, record=f"row group {g}") from e
        for k, v in enumerate(values):
            yield _as_text(v, f"{path}, row {row0 + k} (row group {g})", text_field)
        row0 += len(values)


def _hf_documents(task: Task, text_field: str) -> Iterator[str]:
    what = f"dataset {task.hf['path']} shard {task.start} of {task.stop}"
    ds = _hf_stream(task.hf).shard(num_shards=task.stop, index=task.start)
    for i, row in iter_rows(ds, what):
        record = f"{what}, record {i}"
        yield _as_text(check_field(row, text_field, record), record, text_field)


def plan_documents(plan: Plan) -> Iterator[str]:
    """Every document of the plan in order: the stream a one-process build reads."""
    for t in plan.tasks:
        yield from task_documents(t, plan.text_field)
