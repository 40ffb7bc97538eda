"""OpenAssistant oasst1: message trees -> one conversation per tree along the best-ranked replies.

Input, either
- the hub's flat rows (`OpenAssistant/oasst1`, splits train then validation; or local .parquet/.jsonl
  files of that schema): one message per row with `message_id`, `parent_id`, `message_tree_id`,
  `role`, `text`, `deleted`, `rank`, `lang`. Rows of one tree must be contiguous (they are, in the
  released files); the stream is grouped by `message_tree_id`, so one tree is in memory at a time;
- or a nested-tree JSONL export, one tree per line, flattened to the same rows: the released one
  (`{"message_tree_id", "tree_state", "prompt": {..., "replies": [...]}}`) or the pre-release one, whose
  line is the root message itself (`{"message_id", "role", "text", "replies": [...]}`; its tree id is
  the root's message_id).

The selection of one conversation per tree, and the skips counted per tree: niels_gpt/sources/oasst_trees.py.
Besides:
- a stream with trees but no usable conversation is an error that names what was skipped and why.
- text must be valid Unicode: a lone surrogate escape (`\ud800`, which JSON allows and no tokenizer can
  encode) is an error naming the record and the message.
- `data_files` holding the nested export (its first line a tree, not a flat row) is read as `trees_jsonl`.
Cost: one tree in memory at a time; 31 MB/s on the nested export (tools/measure_sources.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from niels_gpt.errors import ConfigError, SourceError
from niels_gpt.sources.base import ChatSource, rel_files
from niels_gpt.sources.hub import builder_for_all, iter_rows, open_stream
from niels_gpt.sources.oasst_trees import (
    ROLE_MAP,
    SELECTION_RULE,
    SKIP_REASONS,
    best_path,
    count_left_out,
    to_conversation,
)
from niels_gpt.sources.text_io import as_paths, invalid_utf8_error
from niels_gpt.tokenizer.base import Message

OASST_DATASET_ID = "OpenAssistant/oasst1"
OASST_SPLITS = ("train", "validation")
def _check_unicode(row: dict, record: str) -> None:
    """Refuse a lone surrogate escape in a message's text, naming the record: JSON allows `\\ud800`, no
    UTF-8 text (and no tokenizer) can hold it."""
    text = row["text"]
    if isinstance(text, str) and not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise SourceError(f"{record}: message {row['message_id']} holds a lone surrogate escape "
                              f"({e.object[e.start:e.end]!r} at character {e.start}) that no UTF-8 text can hold; "
                              "fix the escape in this record or remove the message") from e


def check_row(row: dict, record: str) -> None:
    for field in ("message_id", "message_tree_id", "role", "text"):
        if field not in row or (row[field] is None and field != "text"):
            nested = "replies" in row or "prompt" in row
            hint = ("; this row holds a nested tree: pass the file as --oasst-trees-jsonl (trees_jsonl=)"
                    if nested else "")
            raise SourceError(f"{record}: no {field!r} (fields: {sorted(row)}); oasst1 rows need "
                              f"message_id, parent_id, message_tree_id, role, text{hint}")
    if row["text"] is not None and not isinstance(row["text"], str):
        raise SourceError(f"{record}: message {row['message_id']} has a {type(row['text']).__name__} 'text' "
                          f"({str(row['text'])[:40]!r}); oasst1 message text must be a string (or null)")
    if row["role"] not in ROLE_MAP:
        raise SourceError(f"{record}: unknown role {row['role']!r} in message {row['message_id']}; "
                          f"oasst1 roles are {sorted(ROLE_MAP)}")
    _check_unicode(row, record)


def _shape(obj) -> str:
    """A short description of what a line holds, for refusals."""
    if not isinstance(obj, dict):
        return f"a JSON {type(obj).__name__}"
    keys = sorted(obj)
    return "an object with keys " + ", ".join(map(repr, keys[:8])) + (", ..." if len(keys) > 8 else "")


def flatten_tree(tree: dict, record: str) -> list[dict]:
    """Rows (as in the flat release) from one nested-export tree; parent_id comes from the nesting.

    Two shapes: the release's `{"message_tree_id", "prompt": root, ...}` and the pre-release bare root
    message `{"message_id", "role", "text", "replies"}` (whose tree id is its own message_id).
    """
    if isinstance(tree, dict) and isinstance(tree.get("prompt"), dict) and "message_tree_id" in tree:
        root, tree_id = tree["prompt"], tree["message_tree_id"]
    elif isinstance(tree, dict) and "message_id" in tree and "role" in tree and "prompt" not in tree:
        root, tree_id = tree, tree["message_id"]
    else:
        raise SourceError(f"{record}: not an oasst1 tree: found {_shape(tree)}; expected the nested export "
                          "({'message_tree_id', 'prompt': {...}}) or a root message ({'message_id', 'role', "
                          "'text', 'replies': [...]}); for flat hub rows use --oasst-data-files instead")
    rows, stack = [], [(root, None)]
    while stack:
        msg, parent = stack.pop()
        if not isinstance(msg, dict):
            raise SourceError(f"{record}: a reply of message {parent} is {_shape(msg)}, not a message object")
        replies = msg.get("replies") or []
        if not isinstance(replies, list):
            raise SourceError(f"{record}: message {msg.get('message_id')} has 'replies' of type "
                              f"{type(replies).__name__}; it must be a list of messages")
        row = {k: v for k, v in msg.items() if k != "replies"}
        row["parent_id"] = parent
        row["message_tree_id"] = tree_id
        rows.append(row)
        stack.extend((r, msg.get("message_id")) for r in reversed(replies))
    return rows


class Oasst1(ChatSource):
    name = "oasst1"

    def __init__(self, *, dataset_id: str, data_files: list[Path] | None, trees_jsonl: list[Path] | None,
                 langs: tuple[str, ...] | None, recognised: bool = False):
        super().__init__()
        self.dataset_id = dataset_id if data_files is None and trees_jsonl is None else None
        self.data_files = data_files
        self.trees_jsonl = trees_jsonl
        self.langs = langs
        self.recognised = recognised  # nested trees passed as data_files, read as trees_jsonl
        self.streaming = trees_jsonl is None

    def files(self) -> list[str]:
        return rel_files(self.trees_jsonl or self.data_files or [])

    def iter_conversations(self) -> Iterator[list[Message]]:
        trees = self._nested_trees() if self.trees_jsonl is not None else self._flat_trees()
        seen = kept = 0
        for rows in trees:
            seen += 1
            if self.langs is not None and not any(
                    r.get("parent_id") is None and r.get("lang") in self.langs for r in rows):
                self.skipped["lang"] += 1
                continue
            path = best_path(rows, self.skipped)
            conv = None if path is None else to_conversation(path, self.skipped)
            if conv is not None:
                count_left_out(rows, path, self.skipped)
                kept += 1
                yield conv
        if seen and not kept:
            raise SourceError(self._none_usable(seen))

    def _none_usable(self, trees: int) -> str:
        where = self.files() or self.dataset_id
        why = "; ".join(f"{n} {reason} ({SKIP_REASONS.get(reason, reason)})"
                        for reason, n in sorted(self.skipped.items()))
        return (f"oasst1 {where}: no usable conversation in {trees} tree(s), skipped: {why}; a conversation needs "
                "a prompt answered by a reply that is neither deleted nor empty")

    def _describe_extra(self) -> dict[str, Any]:
        layout = "nested-tree JSONL" if self.trees_jsonl is not None else "flat rows"
        if self.recognised:
            layout += " (recognised in data_files)"
        return {"layout": layout, "selection": SELECTION_RULE, "langs": None if self.langs is None else list(self.langs)}

    def _flat_rows(self) -> Iterator[tuple[dict, str]]:
        if self.data_files is None:
            for split in OASST_SPLITS:
                what = f"oasst1 {self.dataset_id} (split {split})"
                for i, row in iter_rows(open_stream(self.dataset_id, what, split=split), what):
                    yield row, f"{what}, record {i}"
        else:
            what = f"oasst1 local files {self.files()}"
            ds = open_stream(builder_for_all(self.data_files, "oasst1"), what,
                             data_files=[str(p) for p in self.data_files], split="train")
            for i, row in iter_rows(ds, what, self.data_files):
                yield row, f"{what}, record {i}"

    def _flat_trees(self) -> Iterator[list[dict]]:
        done: set = set()
        current: list[dict] = []
        for row, record in self._flat_rows():
            check_row(row, record)
            tid = row["message_tree_id"]
            if current and tid != current[0]["message_tree_id"]:
                done.add(current[0]["message_tree_id"])
                yield current
                current = []
            if tid in done:
                raise SourceError(f"{record}: rows of tree {tid} are not contiguous (it appeared "
                                  "earlier); sort the rows by message_tree_id first")
            current.append(row)
        if current:
            yield current

    def _nested_trees(self) -> Iterator[list[dict]]:
        for path in self.trees_jsonl or []:
            yield from _nested_file(path)


def _nested_file(path: Path) -> Iterator[list[dict]]:
    # NOTE: read line by line in binary so an error names the line and its byte offset exactly.
    try:
        f = open(path, "rb")
    except OSError as e:
        raise SourceError(f"{path}: cannot read this file ({e.strerror or e}); check that it exists "
                          "and is readable") from e
    offset = 0
    with f:
        for lineno, raw in enumerate(f, start=1):
            record = f"line {lineno}"
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise invalid_utf8_error(path, offset + e.start, line=lineno, reason=e.reason) from e
            offset += len(raw)
            if not text.strip():
                continue
            try:
                tree = json.loads(text)
            except json.JSONDecodeError as e:
                raise SourceError(f"{path}, {record}: invalid JSON ({e.msg} at column {e.colno}); each "
                                  "line must be one oasst1 tree object") from e
            rows = flatten_tree(tree, f"{path}, {record}")
            for r in rows:
                check_row(r, f"{path}, {record}")
            yield rows


def oasst1(*, dataset_id: str = OASST_DATASET_ID,
           data_files: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
           trees_jsonl: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
           langs: Iterable[str] | None = None) -> Oasst1:
    """oasst1 conversations, one per tree. Hub rows by default; data_files: local flat rows
    (.parquet/.jsonl); trees_jsonl: the nested-tree export. langs: keep trees whose root is in these."""
    if data_files is not None and trees_jsonl is not None:
        raise ConfigError("oasst1: pass data_files (flat rows) or trees_jsonl (nested trees), not both")
    files = None if data_files is None else as_paths(data_files, "oasst1 data_files")
    trees = None if trees_jsonl is None else as_paths(trees_jsonl, "oasst1 trees_jsonl")
    recognised = False
    if files is not None:
        builder_for_all(files, "oasst1")
        nested = [p for p in files if holds_nested_trees(p)]
        if nested and len(nested) < len(files):
            flat_ones = [str(p) for p in files if p not in nested]
            raise ConfigError(f"oasst1 data_files: {[str(p) for p in nested]} hold nested trees (one tree per line) "
                              f"and {flat_ones} flat message rows; pass the nested ones as --oasst-trees-jsonl "
                              "(trees_jsonl=) and the flat ones as --oasst-data-files (data_files=)")
        if nested:  # the nested export given as data_files: read it as what it is
            files, trees, recognised = None, nested, True
    return Oasst1(dataset_id=dataset_id, data_files=files, trees_jsonl=trees,
                  langs=None if langs is None else tuple(langs), recognised=recognised)


def holds_nested_trees(path: Path) -> bool:
    """Whether a .jsonl/.json file's first record is a nested oasst1 tree (a root message with its
    replies, or the release's {"message_tree_id", "prompt"} object), not a flat message row."""
    if path.suffix.lower() not in (".jsonl", ".json"):
        return False
    try:
        with open(path, "rb") as f:
            first = next((line for line in f if line.strip()), b"")
        record = json.loads(first)
    except (OSError, ValueError):
        return False  # the flat reader names the unreadable file or line
    return isinstance(record, dict) and ("replies" in record or isinstance(record.get("prompt"), dict))
