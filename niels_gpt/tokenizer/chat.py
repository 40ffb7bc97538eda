"""Chat rendering with a tokenizer's own jinja2 chat template, and the assistant mask from its spans.

The template is rendered as `transformers`' `apply_chat_template` renders it (sandboxed jinja2, trim_blocks,
lstrip_blocks, `raise_exception`, `strftime_now`, a non-ASCII `tojson`, `messages`, `bos_token`, `eos_token`,
`add_generation_prompt`), then encoded whole with special tokens parsed, so the ids are the model's own
tooling's; but `strftime_now(format)` formats base.TEMPLATE_DATE, not today: the same inputs give the same
cache on any day. NOTE: as there, a special token's text typed in a message becomes that special id (templates
may transform contents, so they are not escaped). Tool turns (OpenAI's `tool_calls`, `tool_call_id`, `name`)
reach the template; a `tool` message is never trained. A token is trained when its first character lies in the
span of an assistant message k, the text that message adds:

    start = len(render(messages[:k], add_generation_prompt=True))   # the prompt up to its header
    end   = len(render(messages[:k + 1]))                           # its content and end-of-turn text

(k + 1 renders for k assistant messages; a template that rewrites earlier turns is refused by name), or, where
the template marks them with `{% generation %}...{% endgeneration %}` (transformers' assistant-mask
templates), in the text each such block renders, in one render.
"""

from __future__ import annotations

import contextvars
import datetime
import functools
import json
import re
from collections.abc import Sequence

import numpy as np

from niels_gpt.errors import ConfigError, TokenizerError
from niels_gpt.tokenizer.base import TEMPLATE_DATE, Message, RenderedChat, check_message

TEMPLATE_ROLES = ("system", "user", "assistant", "tool")
PASSED_KEYS = ("tool_calls", "tool_call_id", "name")  # what a template that knows tools reads beside the content
GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
# (text rendered so far, spans of generation blocks) of the render in progress in this thread, if it tracks them
_TRACKED: contextvars.ContextVar = contextvars.ContextVar("generation_spans", default=None)


def _generation_extension():
    """`{% generation %}...{% endgeneration %}`: renders its body, and records where it lies in the output."""
    from jinja2 import nodes
    from jinja2.ext import Extension

    class Generation(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_track"), [], [], body).set_lineno(lineno)

        def _track(self, caller):
            text = caller()
            if (tracked := _TRACKED.get()) is not None:
                start = sum(map(len, tracked[0]))  # every chunk before this block was already emitted
                tracked[1].append((start, start + len(text)))
            return text

    return Generation


@functools.lru_cache(maxsize=8)
def _compile(template: str):
    try:
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as exc:  # pragma: no cover - the hf extra is not installed
        raise TokenizerError("a chat template needs the `jinja2` package: pip install 'niels_gpt[hf]'") from exc

    def raise_exception(message):
        raise TemplateError(message)

    def strftime_now(fmt: str) -> str:
        return datetime.datetime.fromisoformat(TEMPLATE_DATE).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols", _generation_extension()])
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(template)


def render_text(tokenizer, messages: Sequence[Message], add_generation_prompt: bool = False) -> str:
    """The template's text for `messages` (what apply_chat_template(tokenize=False) returns)."""
    return _render(tokenizer, messages, add_generation_prompt)[0]


def _render(tokenizer, messages: Sequence[Message], add_generation_prompt: bool = False
            ) -> tuple[str, list[tuple[int, int]]]:
    """The template's text and the character spans of its `{% generation %}` blocks (none without them)."""
    from jinja2.exceptions import TemplateError

    bos, eos = ("" if t is None else tokenizer.id_to_piece(t)
                for t in (tokenizer.bos_id, tokenizer.special_ids.get("eot")))
    chunks: list[str] = []
    spans: list[tuple[int, int]] = []
    token = _TRACKED.set((chunks, spans))
    try:
        for chunk in _compile(tokenizer.chat_template).generate(
                messages=list(messages), add_generation_prompt=add_generation_prompt,
                bos_token=bos, eos_token=eos):
            chunks.append(chunk)
    except TemplateError as exc:
        raise ConfigError(f"the chat template of {tokenizer.model_path} refused this conversation: {exc}") from exc
    finally:
        _TRACKED.reset(token)
    return "".join(chunks), spans


def _checked(message, index: int) -> dict:
    """The message a template sees: role, content, and the tool keys (PASSED_KEYS) it holds."""
    role, content = check_message(message, index, TEMPLATE_ROLES)
    return {"role": role, "content": content, **{k: message[k] for k in PASSED_KEYS if k in message}}


def render_with_template(tokenizer, messages: Sequence[Message]) -> RenderedChat:
    """Ids and assistant mask of a conversation rendered with the tokenizer's chat template."""
    full, spans = _located(tokenizer, messages)
    chat = _arrays(*tokenizer.encode_rendered(full), spans)
    return RenderedChat(chat.ids.tolist(), chat.mask.tolist())


def template_located(tokenizer, convs: Sequence) -> list:
    """The rendered text and trained spans of each conversation, or the ConfigError it is refused with."""
    located: list = []
    for conv in convs:
        try:
            located.append(_located(tokenizer, conv))
        except ConfigError as exc:
            located.append(exc)
    return located


def template_encoded(tokenizer, located: list, batch: bool = True) -> list:
    """The rendering of each of template_located's texts as arrays (ids int64, mask bool: what the SFT builder
    stores; its errors passed on), with `batch` encoded in one `encode_rendered_batch` call (HF: in parallel,
    the GIL released)."""
    texts = [x[0] for x in located if not isinstance(x, ConfigError)]
    encoded = iter(tokenizer.encode_rendered_batch(texts) if batch else map(tokenizer.encode_rendered, texts))
    return [x if isinstance(x, ConfigError) else _arrays(*next(encoded), x[1]) for x in located]


def _located(tokenizer, messages: Sequence[Message]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered text and the character spans of its trained text (see the module docstring)."""
    checked = [_checked(m, i) for i, m in enumerate(messages)]
    full, spans = _render(tokenizer, checked)
    if not GENERATION_TAG.search(tokenizer.chat_template):
        for k, m in enumerate(checked):
            if m["role"] != "assistant":
                continue
            prompt = render_text(tokenizer, checked[:k], add_generation_prompt=True)
            upto = render_text(tokenizer, checked[:k + 1])
            if not full.startswith(upto) or not upto.startswith(prompt):
                raise ConfigError(f"message {k} (assistant): the chat template of {tokenizer.model_path} "
                                  "renders the conversation so far differently once later messages follow, "
                                  "so the assistant's tokens cannot be located; use a template that only "
                                  "appends turns")
            spans.append((len(prompt), len(upto)))
    return full, spans


def _arrays(ids, starts, spans) -> RenderedChat:
    starts, mask = np.asarray(starts, dtype=np.int64), np.zeros(len(ids), dtype=bool)
    for a, b in spans:  # a token is trained when its first character lies in a span
        mask |= (starts >= a) & (starts < b)
    return RenderedChat(np.asarray(ids, dtype=np.int64), mask)
