"""The tokenizer interface every backend implements, and chat rendering on top of it.

A backend supplies encode/decode, its size and the ids of the four special tokens; everything else
here (batch encoding, chat rendering, token dtype, byte lengths for bits-per-byte) is shared.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Literal, NamedTuple, TypedDict

import numpy as np

from niels_gpt.errors import ConfigError
from niels_gpt.tokenizer.special import ROLE_TO_SPECIAL, SPECIAL_TOKENS

UINT16_LIMIT = 65536


class Message(TypedDict):
    role: Literal["system", "user", "assistant"]
    content: str


class RenderedChat(NamedTuple):
    """Token ids of a rendered conversation and, per id, whether it is a trained target."""

    ids: list[int]
    mask: list[bool]


def token_dtype_for(vocab_size: int) -> np.dtype:
    """Little-endian uint16 when every id fits, else uint32 (see DESIGN: decisions taken)."""
    return np.dtype("<u2") if vocab_size <= UINT16_LIMIT else np.dtype("<u4")


class Tokenizer(ABC):
    """What builders, datasets and evaluation need from a tokenizer."""

    backend: str = "abstract"
    # Set by each backend's __init__: the model file, its sha256, and {"sys", "usr", "asst", "eot"} -> id.
    _path: str
    _sha256: str
    _special: dict[str, int]

    def __getstate__(self):
        return {"model_path": self._path}  # a tokenizer pickles as its path and reloads from it

    def __setstate__(self, state):
        self.__init__(state["model_path"])

    @property
    def model_path(self) -> str:
        return self._path

    @property
    def sha256(self) -> str:
        """sha256 of the model file: recorded in every cache's meta.json."""
        return self._sha256

    @abstractmethod
    def __len__(self) -> int:
        """Every id the tokenizer can emit, special tokens included."""

    @property
    def special_ids(self) -> dict[str, int]:
        """{"sys": id, "usr": id, "asst": id, "eot": id}."""
        return self._special

    @property
    def bos_id(self) -> int | None:
        return None

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Ordinary text to ids. Literal special-token strings stay text."""

    def encode_batch(self, texts: Sequence[str], num_threads: int | None = None) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    @abstractmethod
    def decode(self, ids: Sequence[int]) -> str: ...

    @abstractmethod
    def id_to_piece(self, token_id: int) -> str: ...

    @abstractmethod
    def token_byte_lengths(self) -> np.ndarray:
        """int32[len(self)]: UTF-8 bytes each id stands for in decoded text; special tokens count 0."""

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
        """Render a conversation: per message, its role sentinel, its content, then EOT.

        The mask is True exactly on assistant content tokens and the EOT that closes them: the
        sentinel itself and every system/user token are False. This is the span rule the SFT
        dataset applies to a bare token stream ("after the assistant sentinel up to and including
        the next EOT"), so the cache needs no stored mask.

            [usr] h i [eot] [asst] y o [eot]
              0   0 0   0     0    1 1   1
        """
        ids: list[int] = []
        mask: list[bool] = []
        special = self.special_ids
        eot = special["eot"]
        for i, message in enumerate(messages):
            role, content = _check_message(message, i)
            body = self.encode(content)
            trained = role == "assistant"
            ids.append(special[ROLE_TO_SPECIAL[role]])
            mask.append(False)
            ids.extend(body)
            mask.extend([trained] * len(body))
            ids.append(eot)
            mask.append(trained)
        return RenderedChat(ids, mask)

    def describe(self) -> dict:
        """What meta.json records about the tokenizer of a cache."""
        return {
            "backend": self.backend,
            "sha256": self.sha256,
            "vocab_size": len(self),
            "special_token_ids": dict(self.special_ids),
            "special_tokens": dict(SPECIAL_TOKENS),
            "bos_id": self.bos_id,
        }


def _check_message(message, index: int) -> tuple[str, str]:
    if not isinstance(message, dict):
        raise ConfigError(f"message {index}: expected a dict with 'role' and 'content', got {type(message).__name__}")
    role = message.get("role")
    content = message.get("content")
    if role not in ROLE_TO_SPECIAL:
        raise ConfigError(
            f"message {index}: unknown role {role!r}; expected one of {sorted(ROLE_TO_SPECIAL)}"
        )
    if not isinstance(content, str):
        raise ConfigError(f"message {index} ({role}): content must be str, got {type(content).__name__}")
    return role, content
