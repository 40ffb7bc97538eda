"""Hugging Face `tokenizers` backend: any tokenizer.json, or a `transformers` tokenizer directory.

A tokenizer.json carrying the library's four special tokens as special added tokens
(`add_special_tokens_to`) follows the library's conventions; any other keeps its own: the `eos_token` of a
tokenizer_config.json beside it (else the first of EOS_CANDIDATES it has) ends every document, `bos_token`
(else BOS_CANDIDATES) is its BOS, and its `chat_template` (tokenizer_config.json or chat_template.jinja)
renders chats.
Text is encoded with `encode_special_tokens = True` (a typed "<|ngpt_eot_...|>" stays text) and
`add_special_tokens=False` (no post-processor BOS/EOS); only chat rendering emits special ids.
len(tok) is the highest id + 1, added tokens included.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from niels_gpt.errors import TokenizerError
from niels_gpt.tokenizer.base import Tokenizer
from niels_gpt.tokenizer.special import SPECIAL_TOKENS

BOS_CANDIDATES = ("<s>", "<|begin_of_text|>", "<|bos|>", "<bos>", "[BOS]", "<|startoftext|>")
EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>", "[EOS]")
CONFIG_NAME = "tokenizer_config.json"
TEMPLATE_NAME = "chat_template.jinja"


def read_config(directory: Path) -> tuple[dict, bytes]:
    """tokenizer_config.json of a transformers tokenizer directory ({} when there is none) and its bytes; its
    `chat_template` is the config's, else chat_template.jinja's beside it (with or without a config)."""
    path, config, data = directory / CONFIG_NAME, {}, b""
    if path.is_file():
        data = path.read_bytes()
        try:
            config = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise TokenizerError(f"{path}: not valid JSON ({exc}); fix or remove it") from exc
        if not isinstance(config, dict):
            raise TokenizerError(f"{path}: expected a JSON object, got {type(config).__name__}")
    template = config.get("chat_template")
    if isinstance(template, list):  # transformers' named templates: [{"name": "default", "template": ...}]
        template = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}.get("default")
    if template is None and (jinja := directory / TEMPLATE_NAME).is_file():
        try:
            template = jinja.read_bytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TokenizerError(f"{jinja}: not UTF-8 ({exc.reason} at byte {exc.start}); save the template as "
                                 "UTF-8") from None
    if template is not None and not isinstance(template, str):
        raise TokenizerError(f"{path}: chat_template must be a string, got {type(template).__name__}")
    return {**config, "chat_template": template}, data


def add_special_tokens_to(tokenizer) -> None:
    """Add our four special tokens to a `tokenizers.Tokenizer` as special, unnormalised tokens."""
    from tokenizers import AddedToken

    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t in SPECIAL_TOKENS.values()])


def _byte_decoder() -> dict[str, int]:
    """GPT-2's printable-unicode stand-ins for the 256 bytes, inverted."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


class HFTokenizer(Tokenizer):
    backend = "hf-tokenizers"

    def __init__(self, path: str | os.PathLike, *, eos: int | str | None = None, bos: int | str | None = None,
                 separator: str | None = None):
        try:
            from tokenizers import Tokenizer as _HF
        except ImportError as exc:  # pragma: no cover - the hf extra is not installed
            raise TokenizerError("tokenizer.json needs the `tokenizers` package: pip install "
                                 "'niels_gpt[hf]'") from exc
        p = Path(path)
        if not p.is_file():
            raise TokenizerError(f"no tokenizer.json at {p}; pass the file or its directory")
        data = p.read_bytes()
        try:
            self._tok = _HF.from_str(data.decode("utf-8"))
        except Exception as exc:  # tokenizers raises its own Exception type with a Rust message
            raise TokenizerError(f"{p}: not a Hugging Face tokenizer.json ({exc})") from exc
        self._path, self._sha256 = str(p), hashlib.sha256(data).hexdigest()
        self._tok.encode_special_tokens = True  # literal special strings in text stay text
        added = {t.content: t for t in self._tok.get_added_tokens_decoder().values()}
        self._config, config_bytes = read_config(p.parent)
        self._config_sha256 = hashlib.sha256(config_bytes).hexdigest() if config_bytes else None
        if not any(self._tok.token_to_id(text) is not None for text in SPECIAL_TOKENS.values()):
            # a tokenizer of its own: its EOS separates documents
            self._special = {name: None for name in SPECIAL_TOKENS}
            self._special["eot"] = self._configured("eos_token", EOS_CANDIDATES)
        else:
            for text in SPECIAL_TOKENS.values():
                if text not in added or not added[text].special:
                    raise TokenizerError(f"{p}: special token {text!r} is missing or not a special added "
                                         "token, but others of the library's four are there; add all four "
                                         "with niels_gpt.tokenizer.hf.add_special_tokens_to and re-save")
            self._special = {name: self._tok.token_to_id(text) for name, text in SPECIAL_TOKENS.items()}
        self._special_ids = {self._tok.token_to_id(t.content) for t in added.values() if t.special}
        self._len = max(self._tok.get_vocab(with_added_tokens=True).values()) + 1
        self._apply_options(eos, bos, separator)

    def _configured(self, key: str, candidates: tuple[str, ...]) -> int | None:
        """The id of tokenizer_config.json's `key` token, else of the first candidate in the vocabulary."""
        text = self._config.get(key)
        text = text.get("content") if isinstance(text, dict) else text  # a string or an AddedToken dict
        if isinstance(text, str):
            if (tid := self._tok.token_to_id(text)) is None:
                raise TokenizerError(f"{Path(self._path).parent / CONFIG_NAME}: {key} {text!r} is not in "
                                     f"{self._path}; fix the config or pass --{key.split('_')[0]}")
            return tid
        return next((tid for t in candidates if (tid := self._tok.token_to_id(t)) is not None), None)

    @property
    def chat_template(self) -> str | None:
        return None if self.library_conventions else self._config.get("chat_template")

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def encode_rendered_batch(self, texts: Sequence[str]) -> list[tuple[list[int], list[int]]]:
        """encode_rendered of each text in one call (the Rust side encodes them in parallel, GIL released)."""
        import copy

        if not hasattr(self, "_parsing"):
            self._parsing = copy.deepcopy(self._tok)
            self._parsing.encode_special_tokens = False
        return [(e.ids, [start for start, _ in e.offsets]) for e in self._parsing.encode_batch(
            list(texts), add_special_tokens=False)]

    def describe(self) -> dict:
        out = super().describe()
        if self._config_sha256 is not None and not self.library_conventions:
            out["config_sha256"] = self._config_sha256
        if self.chat_template is not None:  # the config's or chat_template.jinja's: either changes the rendering
            out["chat_template_sha256"] = hashlib.sha256(self.chat_template.encode("utf-8")).hexdigest()
        return out

    def __len__(self) -> int:
        return self._len

    def _own_bos(self) -> int | None:
        return self._configured("bos_token", BOS_CANDIDATES)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str], num_threads: int | None = None) -> list[list[int]]:
        # NOTE: the Rust side spreads a batch over its own Rayon pool (RAYON_NUM_THREADS limits it), so
        # num_threads has no effect here. encode_batch_fast (where installed) skips the character offsets we
        # never read: the same ids for ~23% less CPU (debian-docs, 16k byte-level BPE, one thread).
        encode = getattr(self._tok, "encode_batch_fast", None) or self._tok.encode_batch
        return [e.ids for e in encode(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def id_to_piece(self, token_id: int) -> str:
        piece = self._tok.id_to_token(int(token_id))
        if piece is None:
            raise TokenizerError(f"{self._path}: id {token_id} is not in the vocabulary (0..{self._len - 1})")
        return piece

    def _count_byte_lengths(self) -> np.ndarray:
        out = np.zeros(self._len, dtype=np.int32)
        model = json.loads(self._tok.to_str())
        kinds = {(model.get("decoder") or {}).get("type"), (model.get("pre_tokenizer") or {}).get("type")}
        table = _byte_decoder() if "ByteLevel" in kinds else None
        for i in range(self._len):
            piece = self._tok.id_to_token(i)
            if piece is None or i in self._special_ids:
                continue
            if table is not None and all(ch in table for ch in piece):
                out[i] = len(piece)
            else:
                out[i] = len(self._tok.decode([i], skip_special_tokens=False).encode("utf-8"))
        return out
