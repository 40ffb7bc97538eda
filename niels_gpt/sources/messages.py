"""One chat message of a `messages` record, read the way OpenAI's chat format writes it (docs/own-data.md):
text content parts joined with PART_JOIN (as vLLM joins them), a part of another type a bad record
(`non_text_part`), an assistant's `tool_calls` and the tool role kept for the chat template (the library's
own renderer refuses them: builders/rendering.py); any other key of a message is dropped.
"""

from __future__ import annotations

from typing import Any

from niels_gpt.sources.text_io import BadRecord

ROLES = ("system", "user", "assistant", "tool")
PART_JOIN = "\n"
KEPT = {"assistant": ("tool_calls",), "tool": ("tool_call_id", "name")}  # keys passed on beside role and content


def parse_message(m: Any, k: int, where) -> dict:
    """Message `k` of the record at `where`, checked and read (module table); BadRecord when it cannot be."""
    if not isinstance(m, dict) or m.get("role") not in ROLES:
        raise BadRecord("bad_messages", f"{where}: message {k} is not {{\"role\": one of {list(ROLES)}, "
                        f"\"content\": str or text parts}} (got {str(m)[:80]})")
    role, content = m["role"], m.get("content")
    calls = m.get("tool_calls") if role == "assistant" else None
    if calls is not None and (not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls)):
        raise BadRecord("bad_messages", f"{where}: message {k} (assistant): tool_calls is "
                        f"{type(calls).__name__}, not a list of {{\"type\", \"function\"}} objects")
    if isinstance(content, list):
        content = _text_of_parts(content, k, role, where)
    elif content is None and calls:
        content = ""
    elif not isinstance(content, str):
        raise BadRecord("bad_messages", f"{where}: message {k} ({role}): content is {type(content).__name__}, not "
                        "text or a list of {\"type\": \"text\", \"text\"} parts")
    out = {"role": role, "content": content}
    out.update({key: m[key] for key in KEPT.get(role, ()) if m.get(key) is not None})
    return out


def _text_of_parts(parts: list, k: int, role: str, where) -> str:
    texts = []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif isinstance(kind, str) and kind != "text":
            raise BadRecord("non_text_part", f"{where}: message {k} ({role}) has a {kind!r} content part (part {j}); "
                            "only text parts can be trained: remove such parts from the records")
        else:
            raise BadRecord("bad_messages", f"{where}: message {k} ({role}), content part {j} is not "
                            f"{{\"type\": \"text\", \"text\": str}} (got {str(part)[:80]})")
    return PART_JOIN.join(texts)


def has_tools(conv) -> bool:
    """Whether a conversation holds a tool result or an assistant's tool calls."""
    return any(isinstance(m, dict) and (m.get("role") == "tool" or m.get("tool_calls")) for m in conv)
