"""One oasst1 tree -> one conversation: the selection rule, and the account of every message left out.

Selection, per tree:
- start at the root (the row with no parent_id); at each level keep the children that are not
  deleted and whose text is not empty, and follow the best one: smallest `rank` (0 is best); children
  without a rank come after ranked ones; ties (equal rank, or no ranks) go to the smallest
  `message_id`, which is stable across exports. Stop at a leaf.
- roles: prompter -> user, assistant -> assistant; any other role is an error. A trailing user turn
  (nothing answered it) is dropped; a path with no assistant turn is skipped ("no_assistant_turn").
- counted skips (`SKIP_REASONS` says each one's meaning): a skipped tree is counted once by its reason
  ("deleted_root", "empty_root", "no_root", "lang", "no_assistant_turn"); deleted rows ("deleted_message") and
  rows whose parent is not in their tree ("orphan_message") are counted in every tree; in a tree that gives a
  conversation every other message left out is counted once by why: "empty_message", "trailing_user_turn",
  "unselected_message" (a branch the rank rule did not follow), "cycle_message" (its parents loop),
  "below_orphan_message", "other_root_message". So there, conversation + counted messages = the tree's rows.
Cost: O(messages) per tree, one tree in memory at a time.
"""

from __future__ import annotations

from typing import Any

from niels_gpt.tokenizer.base import Message

ROLE_MAP = {"prompter": "user", "assistant": "assistant"}
SELECTION_RULE = ("root, then at each level the non-deleted, non-empty child with the smallest rank "
                  "(unranked after ranked; ties -> smallest message_id); prompter->user; a trailing user "
                  "turn dropped; paths without an assistant turn skipped")


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
