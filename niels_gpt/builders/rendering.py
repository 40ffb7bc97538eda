"""Whether a conversation can be an example, and its rendering: the rules the SFT builder and a chat build's
tasks share. No torch here: a Ray worker that renders imports only this."""

from __future__ import annotations

from niels_gpt.errors import ConfigError
from niels_gpt.sources.documents import Skipped


def unusable(conv) -> str | None:
    """Why a conversation cannot be an example (its skip reason), or None."""
    if not isinstance(conv, list | tuple) or not conv:
        return "empty_conversation"
    has_answer = False
    for m in conv:
        if isinstance(m, dict) and m.get("role") == "assistant":
            has_answer = has_answer or bool(str(m.get("content", "")).strip())
    return None if has_answer else "no_assistant_turn"


def render(tokenizer, conv):
    """One conversation rendered, a Skipped for one that cannot be an example, or the ConfigError to raise."""
    if isinstance(conv, Skipped):
        return conv
    reason = unusable(conv)
    if reason:
        return Skipped(reason)
    try:
        chat = tokenizer.render_chat(conv)
    except ConfigError as exc:
        return exc
    if not getattr(tokenizer, "library_conventions", True) and not any(chat.mask):
        return Skipped("no_trained_token")
    return chat
