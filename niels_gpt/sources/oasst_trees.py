"""One oasst1 tree -> one conversation: the selection rule (docs/sources.md, "Normalisation"), and every
message left out counted once by reason (`SKIP_REASONS`), so that in a tree that gives a conversation,
conversation + counted messages = the tree's rows. `check_row` refuses a lone surrogate escape (`\\ud800`:
JSON allows it, no tokenizer can encode it). Cost: O(messages) per tree, one tree in memory at a time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from niels_gpt.errors import SourceError
from niels_gpt.sources.inputs import LINES, kind_of
from niels_gpt.sources.lines import first_line
from niels_gpt.tokenizer.base import Message

ROLE_MAP = {"prompter": "user", "assistant": "assistant"}


def _rank_key(row: dict) -> tuple:
    rank = row.get("rank")
    if rank is not None and rank != rank:  # NaN: the hub's float rank column for unranked messages
        rank = None
    return (rank is None, rank if rank is not None else 0, str(row["message_id"]))


SKIP_REASONS = {
    "deleted_root": "trees whose first prompt was deleted",
    "empty_root": "trees whose first prompt is empty",
    "no_root": "trees with no message without a parent",
    "lang": "trees whose first prompt is in none of the languages asked for",
    "no_assistant_turn": "trees whose best path has no assistant reply (a prompt nobody answered, or answers "
                         "that were all deleted or empty)",
    "deleted_message": "deleted messages",
    "orphan_message": "messages whose parent is not in their tree",
    "empty_message": "empty replies on the best path",
    "trailing_user_turn": "prompts at the end of a conversation that nothing answered",
    "unselected_message": "messages on branches the rank rule did not follow",
    "cycle_message": "messages whose parent chain loops, so no path from the first prompt reaches them",
    "below_orphan_message": "messages below a message whose parent is not in the tree",
    "other_root_message": "messages under a second message without a parent (a tree has one first prompt)",
}


def best_path(rows: list[dict], skipped) -> list[dict] | None:
    """The selected message rows of one tree (see the module docstring), or None when skipped."""
    by_id = {r["message_id"]: r for r in rows}
    children: dict[Any, list[dict]] = {}
    roots = []
    for r in rows:
        parent = r.get("parent_id")
        if parent is None:
            roots.append(r)
        elif parent in by_id:
            children.setdefault(parent, []).append(r)
        else:
            skipped["orphan_message"] += 1
        if r.get("deleted"):
            skipped["deleted_message"] += 1
    if not roots:
        skipped["no_root"] += 1
        return None
    # NOTE: a well-formed tree has one root; if an export ever has more, the rank rule picks one.
    node = min(roots, key=_rank_key)
    if node.get("deleted"):
        skipped["deleted_root"] += 1
        return None
    if not (node.get("text") or "").strip():
        skipped["empty_root"] += 1
        return None
    path = [node]
    on_path = {node["message_id"]}
    while True:
        kids = []
        for c in children.get(node["message_id"], []):
            if c.get("deleted") or c["message_id"] in on_path:  # NOTE: a repeated id would loop forever
                continue
            if not (c.get("text") or "").strip():
                skipped["empty_message"] += 1
                continue
            kids.append(c)
        if not kids:
            return path
        node = min(kids, key=_rank_key)
        path.append(node)
        on_path.add(node["message_id"])


def to_conversation(path: list[dict], skipped) -> list[Message] | None:
    conv: list[Message] = [{"role": ROLE_MAP[r["role"]], "content": r["text"]} for r in path]  # type: ignore[typeddict-item]
    trailing = bool(conv) and conv[-1]["role"] == "user"
    if trailing:
        conv.pop()
    if not any(m["role"] == "assistant" for m in conv):
        skipped["no_assistant_turn"] += 1
        return None
    if trailing:
        skipped["trailing_user_turn"] += 1
    return conv


def count_left_out(rows: list[dict], path: list[dict], skipped) -> None:
    """Count by reason every message of a tree that gave a conversation and is not in it, beyond what
    best_path and to_conversation counted (deleted, orphan, empty on the path, trailing user turn)."""
    by_id = {r["message_id"]: r for r in rows}
    children: dict[Any, list[str]] = {}
    for r in rows:
        children.setdefault(r.get("parent_id"), []).append(r["message_id"])
    reachable, stack = set(), [path[0]["message_id"]]
    while stack:
        mid = stack.pop()
        if mid not in reachable:
            reachable.add(mid)
            stack.extend(children.get(mid, []))
    counted = {r["message_id"] for r in path}
    for node in path:  # its empty, non-deleted replies: counted as empty_message by best_path
        counted.update(c for c in children.get(node["message_id"], []) if not by_id[c].get("deleted")
                       and not (by_id[c].get("text") or "").strip())
    for r in rows:
        parent = r.get("parent_id")
        if r["message_id"] in counted or r.get("deleted") or (parent is not None and parent not in by_id):
            continue  # in the conversation, or counted already (deleted_message, orphan_message)
        skipped["unselected_message" if r["message_id"] in reachable else _unreachable(r, by_id)] += 1


def _unreachable(row: dict, by_id: dict) -> str:
    """Why no path from the chosen first prompt reaches `row`: what its parent chain runs into."""
    seen = {row["message_id"]}
    while True:
        parent = row.get("parent_id")
        if parent is None:
            return "other_root_message"
        if parent not in by_id:
            return "below_orphan_message"
        if parent in seen:
            return "cycle_message"
        seen.add(parent)
        row = by_id[parent]


def check_row(row: dict, record: str) -> None:
    for field in ("message_id", "message_tree_id", "role", "text"):
        if field not in row or (row[field] is None and field != "text"):
            nested = "replies" in row or "prompt" in row
            hint = ("; this row holds a nested tree: pass the file as --oasst-trees-jsonl (or --format oasst)"
                    if nested else "")
            raise SourceError(f"{record}: no {field!r} (fields: {sorted(row)}); oasst1 rows need "
                              f"message_id, parent_id, message_tree_id, role, text{hint}")
    if row["text"] is not None and not isinstance(row["text"], str):
        raise SourceError(f"{record}: message {row['message_id']} has a {type(row['text']).__name__} 'text' "
                          f"({str(row['text'])[:40]!r}); oasst1 message text must be a string (or null)")
    if row["role"] not in ROLE_MAP:
        raise SourceError(f"{record}: unknown role {row['role']!r} in message {row['message_id']}; "
                          f"oasst1 roles are {sorted(ROLE_MAP)}")
    text = row["text"]
    if isinstance(text, str) and not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise SourceError(f"{record}: message {row['message_id']} holds a lone surrogate escape "
                              f"({e.object[e.start:e.end]!r} at character {e.start}) that no UTF-8 text can hold; "
                              "fix the escape in this record or remove the message") from e


def _shape(obj) -> str:
    """A short description of what a line holds, for refusals."""
    if not isinstance(obj, dict):
        return f"a JSON {type(obj).__name__}"
    keys = sorted(obj)
    return "an object with keys " + ", ".join(map(repr, keys[:8])) + (", ..." if len(keys) > 8 else "")


def flatten_tree(tree: dict, record: str) -> list[dict]:
    """Flat rows from one nested-export tree: the release's `{"message_tree_id", "prompt": root}` or the
    pre-release bare root message (its tree id is its own message_id)."""
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


def holds_nested_trees(path: Path) -> bool:
    """Whether a JSON Lines file's (`inputs.LINES`: .jsonl, .json, compressed or not) first record is a nested
    oasst1 tree, not a flat message row."""
    if kind_of(path) not in LINES:
        return False
    try:
        record = json.loads(first_line(path))
    except (SourceError, OSError, EOFError, ValueError):
        return False  # the flat reader names the unreadable file or line
    return isinstance(record, dict) and ("replies" in record or isinstance(record.get("prompt"), dict))
