"""From records to documents and conversations: the one set of text rules, and the layouts the library knows.

- The text rules (docs/own-data.md, "What a document is"): a record's text field (a text file: the file),
  BOM dropped and CRLF/CR -> LF (a conversation: each message's content, in every chat layout); null text is
  `null_text`, blank is `empty_document`; a missing or non-text field is a bad record (an error naming it, or
  with on_bad_record="skip" skipped and counted).
- The layouts (`--format NAME`, else `detect`ed from each input's first record): docs/own-data.md, "Layouts
  the library knows"; their rules are sources/layouts.py, sources/oasst_trees.py and sources/messages.py.
- --map runs a user's function (`record_hook`) on every document or conversation; --min-chars drops short ones.
A skipped record stays in the stream as `Skipped(reason)`, so the builder counts it where it was read: the
counts in meta.json are the same whichever executor read the stream.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Iterator
from functools import partial
from typing import Any, NamedTuple

from niels_gpt.errors import ConfigError, SourceError
from niels_gpt.sources.inputs import val_pieces
from niels_gpt.sources.layouts import (
    GUTENBERG_START,
    gutenberg_books,
    instruction_conversation,
    is_article_heading,
    rebuild_articles,
)
from niels_gpt.sources.messages import parse_message
from niels_gpt.sources.oasst_trees import best_path, check_row, count_left_out, flatten_tree, to_conversation
from niels_gpt.sources.text_io import BadRecord, FileText, normalise_text

TEXT_LAYOUTS = ("text", "gutenberg", "wikitext")
CHAT_LAYOUTS = ("messages", "columns", "dolly", "oasst", "sharegpt", "alpaca")
LAYOUTS = TEXT_LAYOUTS + CHAT_LAYOUTS
SHAREGPT_FIELD = "conversations"
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "chatgpt": "assistant", "system": "system"}  # ShareGPT's "from" -> our role
TEXT_FILE_IN_CHAT = "{}: a text file is one document, not a conversation; build it without --chat"
WHOLE_INPUT = ("oasst-rows", "wikitext")  # layouts whose records group across the whole input: one task reads it all


class Skipped(NamedTuple):
    """A record of the stream that is no document (or conversation): counted by `reason` where it is read."""

    reason: str


class Rules(NamedTuple):
    """How records become documents or conversations (what a build's flags say about its records)."""

    text_field: str = "text"
    messages_field: str = "messages"
    chat_columns: tuple[str, str] | None = None
    on_bad_record: str = "error"
    map: str | None = None  # --map module:function: each document or conversation -> the same kind, or None (drop)
    min_chars: int = 0  # --min-chars N: documents (conversations: their contents) of fewer characters are skipped
    val_per_input: bool = False  # --val-per-input: documents cut at blank lines into pieces (inputs.val_pieces)


def text_rule(value: Any, field: str, where) -> str | Skipped:
    """The text rules (module docstring) for one record's text value."""
    if value is None:
        return Skipped("null_text")
    if not isinstance(value, str):
        raise BadRecord("not_text", f"{where}: field {field!r} is {type(value).__name__}, not text; point "
                        "--text-field at a string field")
    if value.startswith("\ufeff") or "\r" in value:
        value = normalise_text(value)
    return value if value and not value.isspace() else Skipped("empty_document")


def chat_rule(item):
    """The text rules for a conversation: each message's content BOM and CRLF normalised (as a document's text)."""
    if isinstance(item, list):
        for m in item:
            content = m.get("content")
            if isinstance(content, str) and (content.startswith("\ufeff") or "\r" in content):
                m["content"] = normalise_text(content)
    return item


def _field(record: dict, field: str, where, fix: str) -> Any:
    if field not in record:
        raise BadRecord("missing_field", f"{where}: no {field!r} field (fields: {sorted(record)}); {fix}")
    return record[field]


def detect(where, record: Any, *, chat: bool, rules: Rules) -> str:
    """The layout of an input from its first record (module table); a record of no known shape is an error."""
    if isinstance(record, BadRecord):
        if chat:
            raise SourceError(f"{record} (the first record of an input decides its layout; fix it, or name the "
                              "layout with --format)")
        return "text"  # the text layout reads it as a bad record (on_bad_record decides)
    if isinstance(record, FileText):
        if chat:
            raise SourceError(TEXT_FILE_IN_CHAT.format(where))
        first = next((line for line in record.text.lstrip("\ufeff").splitlines() if line.strip()), "")
        if "project gutenberg" in first.lower() and GUTENBERG_START.search(record.text):
            return "gutenberg"  # opens with the licence header's title line, and has its START marker
        return "wikitext" if is_article_heading(first) else "text"
    keys = set(record)
    if not chat:
        if rules.text_field in keys:
            return "text"
        if {"instruction", "response"} <= keys or {"instruction", "output"} <= keys or "messages" in keys \
                or SHAREGPT_FIELD in keys or "message_id" in keys or "prompt" in keys:
            raise SourceError(f"{where}: a conversation record (fields {sorted(keys)}), not text; build it with "
                              "--chat, or name the text field with --text-field")
        return "text"  # a record without the field is a bad record of the text layout (on_bad_record decides)
    if rules.chat_columns:
        return "columns"
    if _sharegpt_turns(record.get(rules.messages_field, record.get(SHAREGPT_FIELD))):
        return "sharegpt"
    if rules.messages_field in keys:
        return "messages"
    if {"instruction", "response"} <= keys:
        return "dolly"
    if {"instruction", "output"} <= keys:
        return "alpaca"
    if ("message_tree_id" in keys and isinstance(record.get("prompt"), dict)) or {"message_id", "replies"} <= keys:
        return "oasst"
    if {"message_id", "parent_id", "role", "text"} <= keys:
        return "oasst-rows"
    raise SourceError(f"{where}: no {rules.messages_field!r} field and no known chat layout (fields: "
                      f"{sorted(keys)}); pass --messages-field NAME, --chat-columns USER_COL,ASSISTANT_COL, or "
                      f"--format one of {', '.join(CHAT_LAYOUTS)}")


def _sharegpt_turns(value: Any) -> bool:
    """A ShareGPT conversation: a list of {"from", "value"} turns (its first turn tells)."""
    return isinstance(value, list) and bool(value) and isinstance(value[0], dict) and {"from", "value"} <= set(value[0])


def check_layout(layout: str, chat: bool) -> None:
    allowed = CHAT_LAYOUTS if chat else TEXT_LAYOUTS
    if layout in CHAT_LAYOUTS and not chat:
        raise ConfigError(f"--format {layout}: a chat layout, and this is a pretraining build; add --chat to build an "
                          f"SFT cache from these conversations (pretraining layouts: {', '.join(TEXT_LAYOUTS)})")
    if layout in TEXT_LAYOUTS and chat:
        raise ConfigError(f"--format {layout}: a text layout, and --chat builds an SFT cache from conversations; drop "
                          f"--chat to build a pretraining cache (chat layouts: {', '.join(CHAT_LAYOUTS)})")
    if layout not in allowed:
        kind = "a chat (--chat)" if chat else "a pretraining"
        raise ConfigError(f"--format {layout}: not a layout of {kind} build; use one of {', '.join(allowed)}")


def items(records: Iterable[tuple[Any, Any]], layout: str, rules: Rules) -> Iterator[Any]:
    """Documents (str) or conversations (list of messages), and a Skipped per record that is none; then the
    --map hook and the --min-chars filter, where given."""
    out = _text(records, rules) if layout == "text" else \
        _LAYOUTS[layout](_checked(records, rules, chat=layout not in TEXT_LAYOUTS), rules)
    if layout not in TEXT_LAYOUTS:
        out = map(chat_rule, out)
    if rules.map is None and not rules.min_chars and not rules.val_per_input:
        yield from out
        return
    hook = record_hook(rules.map) if rules.map else None
    for item in out:
        if isinstance(item, Skipped):
            yield item
            continue
        if hook is not None:
            item = mapped(hook, item, rules.map)
            if item is None:
                yield Skipped("dropped_by_map")
                continue
        if rules.min_chars and chars(item) < rules.min_chars:
            yield Skipped("below_min_chars")
            continue
        if rules.val_per_input and isinstance(item, str):
            yield from val_pieces(item)
            continue
        yield item


def record_hook(spec: str):
    """The function `module:function` names (--map), imported here, so every executor's workers run it."""
    import importlib

    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ConfigError(f"--map {spec}: give MODULE:FUNCTION, e.g. --map my_filters:clean")
    try:
        fn = getattr(importlib.import_module(module), name)
    except ImportError as exc:
        raise ConfigError(f"--map {spec}: cannot import {module!r} ({exc}); put it on PYTHONPATH (every worker "
                          "imports it too)") from None
    except AttributeError:
        raise ConfigError(f"--map {spec}: module {module!r} has no {name!r}; check the function's name") from None
    if not callable(fn):
        raise ConfigError(f"--map {spec}: {module}.{name} is not a function")
    return fn


def mapped(hook, item, spec: str):
    out = hook(item)
    if out is None or isinstance(out, str) == isinstance(item, str) and (
            isinstance(out, str) or (isinstance(out, list) and all(isinstance(m, dict) for m in out))):
        return out
    want = "text (str)" if isinstance(item, str) else "a list of {\"role\", \"content\"} messages"
    raise SourceError(f"--map {spec}: returned {type(out).__name__} ({out!r:.60}); it must return {want}, or None "
                      "to drop the record")


def chars(item) -> int:
    if isinstance(item, str):
        return len(item)
    return sum(len(m.get("content") or "") for m in item if isinstance(m, dict))


def _checked(records: Iterable[tuple[Any, Any]], rules: Rules, chat: bool) -> Iterator[tuple[Any, Any]]:
    """Records with bad ones raised (on_bad_record="error") or turned into Skipped (on "skip"); a whole text file
    in a chat layout (`--format dolly` over a .txt) refused."""
    for where, record in records:
        if chat and isinstance(record, FileText):
            raise SourceError(TEXT_FILE_IN_CHAT.format(where))
        yield where, _bad(record, rules) if isinstance(record, BadRecord) else record


def _bad(exc: BadRecord, rules: Rules) -> Skipped:
    if rules.on_bad_record == "error":
        raise SourceError(f"{exc} (or pass --on-bad-record skip to skip and count such records)")
    return Skipped(exc.reason)


def _guard(fn):
    """Run a per-record layout so that a BadRecord it raises follows on_bad_record."""
    def run(records, rules, **kw):
        for where, record in records:
            if isinstance(record, Skipped):
                yield record
                continue
            try:
                yield from fn(where, record, rules, **kw)
            except BadRecord as exc:
                yield _bad(exc, rules)
    return run


def _text(records, rules: Rules):
    """The text layout, bad records included (what `_checked` and `_guard` do for the other layouts).
    NOTE: one loop, not a generator per step: a record whose text field is clean text (no BOM, no CR, not
    blank) costs a dict lookup and three scans (0.2 us a line: bench/bench_parse.py); the rest take the general path."""
    field = rules.text_field
    for where, record in records:
        if type(record) is dict:
            value = record.get(field)
            if type(value) is str and value and "\r" not in value and not value.isspace() \
                    and not value.startswith("\ufeff"):
                yield value
                continue
        if isinstance(record, (Skipped, BadRecord)):
            yield record if isinstance(record, Skipped) else _bad(record, rules)
            continue
        try:
            text = record.text if isinstance(record, FileText) else \
                _field(record, field, where, "pass --text-field NAME or fix the record")
            yield text_rule(text, field, where)
        except BadRecord as exc:
            yield _bad(exc, rules)


@_guard
def _gutenberg(where, record, rules: Rules):
    if not isinstance(record, FileText):
        raise SourceError(f"{where}: --format gutenberg reads whole text files (.txt), not records")
    for book in gutenberg_books(record.text, str(where)):  # several books: one document each
        yield text_rule(book, "text", where)


def _wikitext(records, rules: Rules):
    """Whole articles of a raw wikitext file, or of an input's line rows (the hub's: one row per line, the
    text field), rebuilt across all of that input's rows."""
    records = iter(records)
    for where, record in records:
        if isinstance(record, Skipped):
            yield record
            continue
        if isinstance(record, FileText):
            lines = record.text.split("\n")
        elif isinstance(record, dict):
            lines = _wikitext_rows(itertools.chain([(where, record)], records), rules)
        else:
            raise SourceError(f"{where}: --format wikitext reads raw wikitext files (.raw, .txt) or rows of lines "
                              f"(a {rules.text_field!r} field each), not {type(record).__name__}")
        skipped: Counter = Counter()
        yield from rebuild_articles(lines, skipped)
        for reason, n in sorted(skipped.items()):
            yield from [Skipped(reason)] * n


def _wikitext_rows(records, rules: Rules) -> Iterator[str]:
    for where, record in records:
        if isinstance(record, BadRecord):
            raise SourceError(f"{record} (a wikitext article is rebuilt from every line row: fix the row)")
        if not isinstance(record, dict):
            raise SourceError(f"{where}: a wikitext input holds line rows or one raw file, not both")
        value = _field(record, rules.text_field, where, "wikitext rows hold one line each in the text field")
        if value is not None and not isinstance(value, str):
            raise SourceError(f"{where}: field {rules.text_field!r} is {type(value).__name__}, not text")
        yield value or ""


@_guard
def _messages(where, record, rules: Rules):
    msgs = _field(record, rules.messages_field, where,
                  "pass --messages-field NAME, or --chat-columns USER_COL,ASSISTANT_COL")
    if not isinstance(msgs, list):
        raise BadRecord("bad_messages", f"{where}: {rules.messages_field!r} is {type(msgs).__name__}, not a list of "
                        "{\"role\", \"content\"} messages")
    yield [parse_message(m, k, where) for k, m in enumerate(msgs)]  # OpenAI's content parts and tools too


@_guard
def _sharegpt(where, record, rules: Rules):
    field = rules.messages_field if rules.messages_field in record else SHAREGPT_FIELD
    turns = _field(record, field, where, "pass --messages-field NAME")
    if not isinstance(turns, list):
        raise BadRecord("bad_messages", f"{where}: {field!r} is {type(turns).__name__}, not a list of "
                        "{\"from\", \"value\"} turns")
    out = []
    for k, t in enumerate(turns):
        role = SHAREGPT_ROLES.get(t.get("from")) if isinstance(t, dict) else None
        if role is None or not isinstance(t.get("value"), str):
            raise BadRecord("bad_messages", f"{where}: turn {k} is not {{\"from\": one of {list(SHAREGPT_ROLES)}, "
                            f"\"value\": str}} (got {str(t)[:80]})")
        out.append({"role": role, "content": t["value"]})
    yield out


@_guard
def _instruction(where, record, rules: Rules, layout: str):
    conv = instruction_conversation(record, where, layout)
    yield Skipped(conv) if isinstance(conv, str) else conv


@_guard
def _columns(where, record, rules: Rules):
    out = []
    for col, role in zip(rules.chat_columns, ("user", "assistant"), strict=True):
        value = record.get(col)
        if not isinstance(value, str):
            raise BadRecord("missing_field" if col not in record else "not_text",
                            f"{where}: column {col!r} is {'missing' if col not in record else type(value).__name__}, "
                            "not text; pass --chat-columns USER_COL,ASSISTANT_COL")
        out.append({"role": role, "content": value})
    yield out


def _oasst_trees(records, rules: Rules):
    for where, record in records:
        if isinstance(record, Skipped):
            yield record
            continue
        rows = flatten_tree(record, str(where))
        for r in rows:
            check_row(r, str(where))
        yield from _best(rows)


def _best(rows: list[dict]) -> Iterator[Any]:
    skipped: Counter = Counter()
    path = best_path(rows, skipped)
    conv = None if path is None else to_conversation(path, skipped)
    if conv is not None:
        count_left_out(rows, path, skipped)  # every message of the tree not in its conversation, by reason
        yield conv
    for reason, n in sorted(skipped.items()):
        yield from [Skipped(reason)] * n


def _oasst_rows(records, rules: Rules):
    done: set = set()
    current: list[dict] = []
    for where, row in records:
        if isinstance(row, Skipped):
            yield row
            continue
        check_row(row, str(where))
        tid = row["message_tree_id"]
        if current and tid != current[0]["message_tree_id"]:
            done.add(current[0]["message_tree_id"])
            yield from _best(current)
            current = []
        if tid in done:
            raise SourceError(f"{where}: rows of tree {tid} are not contiguous (it appeared earlier); sort the rows "
                              "by message_tree_id first")
        current.append(row)
    if current:
        yield from _best(current)


_LAYOUTS = {"text": _text, "gutenberg": _gutenberg, "wikitext": _wikitext, "messages": _messages,
            "columns": _columns, "oasst": _oasst_trees, "oasst-rows": _oasst_rows, "sharegpt": _sharegpt,
            **{name: partial(_instruction, layout=name) for name in ("dolly", "alpaca")}}
