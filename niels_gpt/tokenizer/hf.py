"""Hugging Face `tokenizers` backend: any tokenizer.json, e.g. for vocabularies above 65,536 ids.

    tok = HFTokenizer("tokenizer.json")        # or load_tokenizer("dir/with/tokenizer.json")

The four special tokens of niels_gpt.tokenizer.special must be in the file as *special added
tokens* (`add_special_tokens_to(tokenizer)` puts them there before saving). By default
`tokenizers` splits input text on added tokens, so a user who types "<|ngpt_eot_...|>" would get
the real EOT id; we set `encode_special_tokens = True`, which makes the encoder treat special
tokens in text as ordinary text, and encode with `add_special_tokens=False` so no post-processor
template inserts BOS/EOS behind our back. Only render_chat (and code that asks for ids by role)
emits special ids.

len(tok) is the highest id + 1 (added tokens included): every id it can emit. token dtype follows
from it (uint32 above 65,536 ids). token_byte_lengths() decodes each id on its own (byte-level
BPE tokens through the GPT-2 byte table, so partial UTF-8 counts right); specials count 0.
Pickles as its path.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from niels_gpt.errors import TokenizerError
from niels_gpt.tokenizer.base import Tokenizer
from niels_gpt.tokenizer.special import SPECIAL_TOKENS

BOS_CANDIDATES = ("<s>", "<|begin_of_text|>", "<|bos|>", "<bos>", "[BOS]", "<|startoftext|>")


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

    def __init__(self, path: str | os.PathLike):
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
        self._special = {}
        for name, text in SPECIAL_TOKENS.items():
            tid = self._tok.token_to_id(text)
            if tid is None or text not in added or not added[text].special:
                raise TokenizerError(f"{p}: special token {text!r} is missing or not a special added token; "
                                     "add them with niels_gpt.tokenizer.hf.add_special_tokens_to and re-save")
            self._special[name] = tid
        self._specials = {t for t in added.values() if t.special}
        self._len = max(self._tok.get_vocab(with_added_tokens=True).values()) + 1
        self._byte_lengths: np.ndarray | None = None

    def __len__(self) -> int:
        return self._len

    @property
    def bos_id(self) -> int | None:
        for text in BOS_CANDIDATES:
            tid = self._tok.token_to_id(text)
            if tid is not None:
                return tid
        return None

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str], num_threads: int | None = None) -> list[list[int]]:
        # the Rust side parallelises a batch over RAYON threads (TOKENIZERS_PARALLELISM)
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def id_to_piece(self, token_id: int) -> str:
        piece = self._tok.id_to_token(int(token_id))
        if piece is None:
            raise TokenizerError(f"{self._path}: id {token_id} is not in the vocabulary (0..{self._len - 1})")
        return piece

    def _is_byte_level(self) -> bool:
        import json

        model = json.loads(self._tok.to_str())
        kinds = {(model.get("decoder") or {}).get("type"), (model.get("pre_tokenizer") or {}).get("type")}
        return "ByteLevel" in kinds

    def token_byte_lengths(self) -> np.ndarray:
        if self._byte_lengths is None:
            out = np.zeros(self._len, dtype=np.int32)
            special_ids = {self._tok.token_to_id(t.content) for t in self._specials}
            table = _byte_decoder() if self._is_byte_level() else None
            for i in range(self._len):
                piece = self._tok.id_to_token(i)
                if piece is None or i in special_ids:
                    continue
                if table is not None and all(ch in table for ch in piece):
                    out[i] = len(piece)
                else:
                    out[i] = len(self._tok.decode([i], skip_special_tokens=False).encode("utf-8"))
            self._byte_lengths = out
        return self._byte_lengths
