"""Whether a conversation can be an example, and its rendering: the rules the SFT builder and a chat build's
tasks share. No torch here: a Ray worker that renders imports only this.

Tool turns (sources/messages.py) need a chat template: the library's renderer has none, so a conversation
holding one is refused (with on_bad_record="skip": skipped as `tool_turn`).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from niels_gpt.builders.encoding import ENCODE_BATCH_DOCS
from niels_gpt.errors import ConfigError
from niels_gpt.sources.documents import Skipped
from niels_gpt.sources.messages import has_tools
from niels_gpt.tokenizer.base import RenderedChat, Tokenizer
from niels_gpt.tokenizer.chat import template_encoded, template_located
from niels_gpt.tokenizer.fast import message_encoder

NO_TOOL_TURNS = ("the conversation holds a tool call or a tool result, and the library's chat format has no tool "
                 "turns; use a tokenizer whose chat template renders tools (a tokenizer_config.json with a "
                 "chat_template, or --chat-template FILE), or pass --on-bad-record skip to skip and count such "
                 "conversations")


def renderings(tokenizer, items: Iterable, on_bad_record: str = "error", workers: int = 1,
               conv_of: Callable = lambda item: item, one_core: bool = False) -> Iterator[tuple]:
    """(item, its rendering) in input order: a rendering, a Skipped for a conversation that cannot be an
    example, or the ConfigError to raise. A run of ENCODE_BATCH_DOCS items at once: their messages encoded by
    the fast encoder (checked on the first run; tokenizer/fast.py), or a chat template's texts in one call on
    a thread while the next run is rendered (tokenizer/chat.py), else on `workers` threads. `one_core`: none
    of that (a parallel build's task: a process on a core of its own). The bytes written depend on none of
    it."""
    it = iter(items)
    batch = list(itertools.islice(it, ENCODE_BATCH_DOCS))
    encode = message_encoder(tokenizer, [conv_of(item) for item in batch])
    template = isinstance(tokenizer, Tokenizer) and tokenizer.chat_template is not None
    threads = workers > 1 and encode is None and not template  # the reference encoder releases the GIL
    ahead = template and not one_core  # the template's encode on a thread, the next run rendered meanwhile

    def start(convs: list) -> tuple[list, object]:
        out = [_unrenderable(tokenizer, conv, on_bad_record) for conv in convs]
        todo = [conv for conv, o in zip(convs, out, strict=True) if o is None]
        if template:
            located = template_located(tokenizer, todo)
            return out, (pool.submit(template_encoded, tokenizer, located) if ahead else
                         template_encoded(tokenizer, located, batch=False))
        return out, (pool.map(lambda conv: _rendered(tokenizer, conv, encode), todo) if threads else
                     [_rendered(tokenizer, conv, encode) for conv in todo])

    def finish(out: list, done) -> list:
        done = iter(done.result() if isinstance(done, Future) else done)
        return [o if o is not None else _kept(tokenizer, next(done)) for o in out]

    pool = ThreadPoolExecutor(1 if ahead else workers) if ahead or threads else contextlib.nullcontext()
    with pool:
        pending = None
        while batch or pending:
            started = (batch, *start([conv_of(item) for item in batch])) if batch else None
            if pending:
                yield from zip(pending[0], finish(*pending[1:]), strict=True)
            pending, batch = started, list(itertools.islice(it, ENCODE_BATCH_DOCS)) if batch else []


def _unrenderable(tokenizer, conv, on_bad_record: str):
    """The Skipped or ConfigError of a conversation that cannot be an example, else None."""
    if isinstance(conv, Skipped):
        return conv
    if not isinstance(conv, list | tuple) or not conv:
        return Skipped("empty_conversation")
    if not any(isinstance(m, dict) and m.get("role") == "assistant" and
               (str(m.get("content", "")).strip() or m.get("tool_calls")) for m in conv):
        return Skipped("no_assistant_turn")
    if getattr(tokenizer, "chat_template", None) is None and has_tools(conv):
        return Skipped("tool_turn") if on_bad_record == "skip" else ConfigError(NO_TOOL_TURNS)
    return None


def _rendered(tokenizer, conv, encode):
    try:
        if encode:  # the fast encoder's: ids only (no mask: the span rule finds it in the stored stream)
            return RenderedChat(tokenizer.sentinel_rendering(conv, encode), None)
        return tokenizer.render_chat(conv)
    except ConfigError as exc:
        return exc


def _kept(tokenizer, chat):
    """A chat template's rendering with no trained token is skipped (as `no_trained_token`)."""
    plain = not isinstance(chat, RenderedChat) or getattr(tokenizer, "library_conventions", True)
    return chat if plain or np.any(chat.mask) else Skipped("no_trained_token")
