"""The tokenizer interface every backend implements, and chat rendering on top of it.

A backend supplies encode/decode, its size and its special ids; batch encoding, the document separator, chat
rendering, the token dtype and byte lengths (for bits per byte) are shared. The library's own tokenizer (one
that carries the four chat tokens) ends every document with our EOT and renders chats with our sentinels; any
other keeps its own conventions: its EOS ends every document (or its BOS starts each, `separator="bos"`),
`eos`/`bos` override which token that is, and its chat template renders chats (niels_gpt.tokenizer.chat);
its special_ids hold its EOS as "eot" and None for the sentinels.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Literal, NamedTuple, TypedDict

import numpy as np

from niels_gpt.constants import token_dtype_for
from niels_gpt.errors import ConfigError, TokenizerError
from niels_gpt.spans import assistant_token_mask
from niels_gpt.tokenizer.special import ROLE_TO_SPECIAL, ROLES, SPECIAL_TOKENS

# the day a chat template's strftime_now() formats: fixed, so a cache does not depend on the day it was built
# (the date Llama 3.x templates write when strftime_now is not given, so their renderings stay as they were)
TEMPLATE_DATE = "2024-07-26"


class Message(TypedDict):
    role: Literal["system", "user", "assistant"]
    content: str


class Separator(NamedTuple):
    """The token between documents: which one ("eot" or "bos"), its id, and whether it ends or starts each."""

    token: str
    id: int
    position: str  # "after" or "before"

    def describe(self) -> dict:
        return {"token": self.token, "id": self.id, "position": f"{self.position} every document"}


SEPARATOR_CHOICES = ("eos", "bos")


def document_separator(tokenizer) -> Separator:
    """The separator of any tokenizer-like object: its `separator`, else its special_ids["eot"] after each document."""
    if isinstance(tokenizer, Tokenizer):
        return tokenizer.separator
    return Separator("eot", tokenizer.special_ids["eot"], "after")


class RenderedChat(NamedTuple):
    """Token ids of a rendered conversation and, per id, whether it is a trained target."""

    ids: list[int]
    mask: list[bool]


class Tokenizer(ABC):
    """What builders, datasets and evaluation need from a tokenizer."""

    backend: str = "abstract"
    # True: the cache builder encodes in forked processes, for an encoder that does not scale on threads
    encode_in_processes: bool = False
    # Set by each backend's __init__: the model file, its sha256, {"sys", "usr", "asst", "eot"} -> id (None
    # where the tokenizer has no such token) and the conventions chosen when loading (eos, bos, separator).
    _path: str
    _sha256: str
    _special: dict[str, int | None]
    _options: dict = {}

    def __getstate__(self):
        # a tokenizer pickles as its path (and the conventions it was loaded with) and reloads from it
        return {"model_path": self._path, "options": dict(self._options)}

    def __setstate__(self, state):
        self.__init__(state["model_path"], **state.get("options", {}))

    @property
    def model_path(self) -> str:
        return self._path

    @property
    def sha256(self) -> str:
        return self._sha256

    @abstractmethod
    def __len__(self) -> int:
        """Every id the tokenizer can emit, special tokens included."""

    @property
    def special_ids(self) -> dict[str, int]:
        return self._special

    @property
    def bos_id(self) -> int | None:
        bos = self._options.get("bos")
        return self._own_bos() if bos is None else self._token_id(bos, "bos")

    def _own_bos(self) -> int | None:
        return None

    @abstractmethod
    def token_to_id(self, token: str) -> int | None:
        """The id of a token given as its text (special tokens included), or None."""

    def _token_id(self, value: int | str, what: str) -> int:
        """An --eos/--bos value (an id, or a token's text) as an id inside the vocabulary."""
        if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
            tid = int(value)
            if not 0 <= tid < len(self):
                raise TokenizerError(f"{self.model_path}: --{what} {value}: id outside the vocabulary (0..{len(self) - 1})")
            return tid
        tid = self.token_to_id(value)
        if tid is None:
            raise TokenizerError(f"{self.model_path}: --{what} {value!r} is not a token of this tokenizer; give the "
                                 "token's exact text or its id")
        return tid

    def _apply_options(self, eos: int | str | None, bos: int | str | None, separator: str | None) -> None:
        """Record the conventions chosen when loading; called last by each backend's __init__."""
        if separator is not None and separator not in SEPARATOR_CHOICES:
            raise TokenizerError(f"separator must be one of {SEPARATOR_CHOICES}, got {separator!r}")
        self._options = {k: v for k, v in (("eos", eos), ("bos", bos), ("separator", separator)) if v is not None}
        if eos is not None:
            if self.library_conventions:
                raise TokenizerError(f"{self.model_path}: the library's tokenizer ends documents with its own EOT "
                                     f"(id {self._special['eot']}); --eos applies to other tokenizers only")
            self._special = {**self._special, "eot": self._token_id(eos, "eos")}
        if bos is not None:
            self._token_id(bos, "bos")  # refuse a bad value now, not at the first build

    @property
    def options(self) -> dict:
        """The conventions chosen when loading (eos, bos, separator given), as load_tokenizer takes them."""
        return dict(self._options)

    @property
    def library_conventions(self) -> bool:
        """True when the tokenizer carries the library's four chat tokens (the contract's format)."""
        return all(self._special.get(k) is not None for k in ("sys", "usr", "asst", "eot"))

    @property
    def chat_template(self) -> str | None:
        return None

    @property
    def separator(self) -> Separator:
        """EOT (the tokenizer's EOS) after every document; with separator="bos", its BOS before every one."""
        choice = self._options.get("separator") or "eos"
        if choice == "bos":
            if self.bos_id is None:
                raise TokenizerError(f"{self.model_path}: separator 'bos' asked for, but the tokenizer has no BOS "
                                     "token; name one with --bos TOKEN (or an id), or use --separator eos")
            return Separator("bos", self.bos_id, "before")
        eot = self._special.get("eot")
        if eot is None:
            raise TokenizerError(f"{self.model_path}: no end-of-text token found (no eos_token in its config and "
                                 "none of the usual names); name the document separator with --eos TOKEN (or an "
                                 "id), or --bos TOKEN --separator bos")
        return Separator("eot", eot, "after")

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Ordinary text to ids. Literal special-token strings stay text."""

    def encode_batch(self, texts: Sequence[str], num_threads: int | None = None) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    @abstractmethod
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Ids to text; special tokens are dropped, or kept as their text with skip_special_tokens=False."""

    @abstractmethod
    def id_to_piece(self, token_id: int) -> str: ...

    def encode_rendered(self, text: str) -> tuple[list[int], list[int]]:
        """Ids of a chat rendered by the chat template, special tokens written as text parsed as their ids, and
        each id's start offset in `text` (characters): `encode_rendered_batch` (a backend with templates) of one."""
        return self.encode_rendered_batch([text])[0]

    def token_byte_lengths(self) -> np.ndarray:
        """int32[len(self)]: UTF-8 bytes each id stands for in decoded text; special tokens count 0."""
        if "_byte_lengths" not in self.__dict__:  # counted once per tokenizer
            self._byte_lengths = self._count_byte_lengths()
        return self._byte_lengths

    @abstractmethod
    def _count_byte_lengths(self) -> np.ndarray: ...

    @property
    def eot_id(self) -> int:
        return self.special_ids["eot"]

    @property
    def asst_id(self) -> int:
        return self.special_ids["asst"]

    @property
    def vocab_size(self) -> int:
        return len(self)

    @property
    def token_dtype(self) -> np.dtype:
        return token_dtype_for(len(self))

    def render_chat(self, messages: Sequence[Message]) -> RenderedChat:
        """Render a conversation with the tokenizer's chat template (niels_gpt.tokenizer.chat), else with the
        library's sentinels (`sentinel_rendering`): per message its role sentinel, its content, EOT. The mask is
        the span rule (niels_gpt.spans) the SFT dataset applies to the stored stream: assistant content and its EOT.

            [usr] h i [eot] [asst] y o [eot]
              0   0 0   0     0    1 1   1
        """
        if self.chat_template is not None:
            # lazy: chat.py builds on this module (and jinja2), so it can only load after it
            from niels_gpt.tokenizer.chat import render_with_template

            return render_with_template(self, messages)
        ids = self.sentinel_rendering(messages)
        mask = assistant_token_mask(ids, self.special_ids["asst"], self.special_ids["eot"])
        return RenderedChat(ids.tolist(), mask.tolist())

    def sentinel_rendering(self, messages: Sequence[Message], encode=None) -> np.ndarray:
        """render_chat's ids with the library's sentinels as one int64 array (what the SFT builder stores), each
        message's content encoded by `encode` (default self.encode; the builder's: tokenizer/fast.py)."""
        if not self.library_conventions:
            raise TokenizerError(f"{self.model_path}: this tokenizer has no chat template and not the library's four "
                                 "chat tokens, so conversations cannot be rendered; pass --chat-template FILE (a "
                                 "sentencepiece model), or use a tokenizer directory whose tokenizer_config.json has "
                                 "a chat_template")
        special, encode = self.special_ids, encode or self.encode
        pieces: list = []
        for i, message in enumerate(messages):
            role, content = check_message(message, i)
            pieces += [[special[ROLE_TO_SPECIAL[role]]], encode(content), [special["eot"]]]
        return np.concatenate([np.asarray(p, dtype=np.int64) for p in pieces]) if pieces else np.zeros(0, np.int64)

    def describe(self) -> dict:
        """What meta.json records about the tokenizer of a cache."""
        out = {"backend": self.backend, "sha256": self.sha256, "vocab_size": len(self), "bos_id": self.bos_id,
               "special_token_ids": dict(self.special_ids), "special_tokens": dict(SPECIAL_TOKENS)}
        if not self.library_conventions or self._options:
            out["special_tokens"] = {k: self.id_to_piece(v) for k, v in self.special_ids.items() if v is not None}
            out["conventions"] = "own" if not self.library_conventions else "niels_gpt"
            out["options"] = dict(self._options)
            out["chat"] = ("template" if self.chat_template is not None
                           else "niels_gpt sentinels" if self.library_conventions else None)
        if "strftime_now" in (self.chat_template or ""):
            out["chat_template_date"] = TEMPLATE_DATE  # what its strftime_now() formats
        return out


def check_message(message, index: int, roles: tuple[str, ...] = ROLES) -> tuple[str, str]:
    """(role, content) of a message, refused by name unless a dict of a known role and str content."""
    if not isinstance(message, dict):
        raise ConfigError(f"message {index}: expected a dict with 'role' and 'content', got {type(message).__name__}")
    role, content = message.get("role"), message.get("content")
    if role not in roles:
        raise ConfigError(f"message {index}: unknown role {role!r}; expected one of {list(roles)}")
    if not isinstance(content, str):
        raise ConfigError(f"message {index} ({role}): content must be str, got {type(content).__name__}")
    if not content.isascii():
        try:
            content.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate: no tokenizer takes it (sentencepiece: a bare error)
            raise ConfigError(f"message {index} ({role}): content holds a lone surrogate {content[exc.start]!r} at "
                              f"character {exc.start}, which is not text; fix or drop the message") from None
    return role, content
