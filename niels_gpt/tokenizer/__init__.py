"""Tokenizers: sentencepiece (trained here) and Hugging Face `tokenizers` JSON, one interface.

    tok = load_tokenizer("cache/tokenizer")          # dir with spm.model, or a .model/.json file
    ids = tok.encode("hello")                        # literal special strings stay text
    chat = tok.render_chat([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])
    chat.ids, chat.mask                              # mask: assistant content + its EOT
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from niels_gpt.errors import TokenizerError
from niels_gpt.tokenizer.base import Message, RenderedChat, Tokenizer, token_dtype_for
from niels_gpt.tokenizer.special import (
    ASST_TOKEN,
    EOT_TOKEN,
    ROLES,
    SPECIAL_TOKENS,
    SYS_TOKEN,
    USR_TOKEN,
)
from niels_gpt.tokenizer.spm import SentencePieceTokenizer, TrainSettings, train_sentencepiece

MODEL_NAME = "spm.model"

__all__ = [
    "ASST_TOKEN", "EOT_TOKEN", "MODEL_NAME", "Message", "ROLES", "RenderedChat", "SPECIAL_TOKENS",
    "SYS_TOKEN", "SentencePieceTokenizer", "Tokenizer", "TrainSettings", "USR_TOKEN",
    "load_tokenizer", "token_dtype_for", "train_tokenizer",
]


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """Open a tokenizer: a directory holding spm.model (or tokenizer.json), or the file itself."""
    p = Path(path)
    if p.is_dir():
        for name in (MODEL_NAME, "tokenizer.json"):
            if (p / name).is_file():
                return load_tokenizer(p / name)
        raise TokenizerError(f"{p}: no {MODEL_NAME} or tokenizer.json in this directory; "
                             "train one with `train-tokenizer` or point --tokenizer at the model file")
    if p.suffix == ".json":
        from niels_gpt.tokenizer.hf import HFTokenizer

        return HFTokenizer(p)
    return SentencePieceTokenizer(p)


def train_tokenizer(texts: Iterable[str], out_dir: str | os.PathLike, *,
                    settings: TrainSettings | None = None, trained_on: object = None) -> SentencePieceTokenizer:
    """Train on `texts`, write out_dir/spm.model then out_dir/meta.json (the commit marker)."""
    settings = settings or TrainSettings()
    from niels_gpt.atomic import write_bytes_atomic
    from niels_gpt.cache.meta import write_meta
    from niels_gpt.tokenizer.spm import settings_dict

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stale = out / "meta.json"
    if stale.exists():
        stale.unlink()  # the directory is not a finished tokenizer until the new meta lands
    model, stats = train_sentencepiece(texts, settings)
    write_bytes_atomic(out / MODEL_NAME, model)
    tok = SentencePieceTokenizer(out / MODEL_NAME)
    write_meta(str(out), {
        "kind": "tokenizer",
        "format_version": 1,
        "model_file": MODEL_NAME,
        "tokenizer_sha256": tok.sha256,
        "vocab_size": len(tok),
        "special_token_ids": dict(tok.special_ids),
        "special_tokens": dict(SPECIAL_TOKENS),
        "bos_id": tok.bos_id,
        "settings": settings_dict(settings),
        "trained_on": trained_on,
        "training_text": stats,
    })
    return tok
