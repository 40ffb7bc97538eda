"""Whether a conversation can be an example, and its rendering: the rules the SFT builder and a chat build's
tasks share. No torch here: a Ray worker that renders imports only this.

Tool turns (sources/messages.py) need a chat template: the library's renderer has none, so a conversation
holding one is refused (with on_bad_record="skip": skipped as `tool_turn`).
"""

from __future__ import annotations

from niels_gpt.errors import ConfigError
from niels_gpt.sources.documents import Skipped
from niels_gpt.sources.messages import has_tools
from niels_gpt.tokenizer.base import RenderedChat

NO_TOOL_TURNS = ("the conversation holds a tool call or a tool result, and the library's chat format has no tool "
                 "turns; use a tokenizer whose chat template renders tools (a tokenizer_config.json with a "
                 "chat_template, or --chat-template FILE), or pass --on-bad-record skip to skip and count such "
                 "conversations")


def unusable(conv) -> str | None:
    """Why a conversation cannot be an example (its skip reason), or None."""
    if not isinstance(conv, list | tuple) or not conv:
        return "empty_conversation"
    has_answer = False
    for m in conv:
        if isinstance(m, dict) and m.get("role") == "assistant":
            has_answer = has_answer or bool(str(m.get("content", "")).strip()) or bool(m.get("tool_calls"))
    return None if has_answer else "no_assistant_turn"


def render(tokenizer, conv, on_bad_record: str = "error", encode=None):
    """One conversation rendered (`encode`: the messages' encoder, tokenizer/fast.py's message_encoder), a
    Skipped for one that cannot be an example, or the ConfigError to raise."""
    if isinstance(conv, Skipped):
        return conv
    reason = unusable(conv)
    if reason:
        return Skipped(reason)
    if getattr(tokenizer, "chat_template", None) is None and has_tools(conv):
        return Skipped("tool_turn") if on_bad_record == "skip" else ConfigError(NO_TOOL_TURNS)
    try:
        # the fast encoder's: ids only (no mask: the span rule finds it in the stored stream)
        chat = RenderedChat(tokenizer.sentinel_rendering(conv, encode), None) if encode else tokenizer.render_chat(conv)
    except ConfigError as exc:
        return exc
    if not getattr(tokenizer, "library_conventions", True) and not any(chat.mask):
        return Skipped("no_trained_token")
    return chat
