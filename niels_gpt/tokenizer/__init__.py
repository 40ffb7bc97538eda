"""Tokenizers: sentencepiece (trained here), Hugging Face `tokenizers` and tiktoken, one interface.

    tok = load_tokenizer("cache/tokenizer")   # spm.model, tokenizer.json or tokenizer.tiktoken, or the file
    tok = load_tokenizer("cl100k_base")       # a tiktoken encoding name, or a Hugging Face hub "owner/name"
    ids = tok.encode("hello")                 # literal special strings stay text
    chat = tok.render_chat([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])
    chat.ids, chat.mask                       # mask: the assistant's trained tokens
    tok.separator                             # the document separator: Separator(token, id, position)

A tokenizer other than the library's keeps its own conventions (niels_gpt.tokenizer.base).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path

from niels_gpt.atomic import remove_stale_temporaries, write_bytes_atomic
from niels_gpt.constants import META_NAME, MODEL_NAME
from niels_gpt.errors import FormatError, TokenizerError
from niels_gpt.markers import read_json
from niels_gpt.meta import write_meta
from niels_gpt.tokenizer.base import SEPARATOR_CHOICES, Tokenizer
from niels_gpt.tokenizer.hf import HFTokenizer
from niels_gpt.tokenizer.special import ASST_TOKEN, EOT_TOKEN, SPECIAL_TOKENS, SYS_TOKEN, USR_TOKEN
from niels_gpt.tokenizer.spm import SentencePieceTokenizer, TrainSettings, train_sentencepiece
from niels_gpt.tokenizer.tiktoken_backend import (
    RANKS_NAME,
    TiktokenTokenizer,
    is_tiktoken_spec,
    train_rustbpe,
)

__all__ = ["ASST_TOKEN", "EOT_TOKEN", "MODEL_NAME", "SEPARATOR_CHOICES", "SPECIAL_TOKENS", "SYS_TOKEN",
           "SentencePieceTokenizer", "Tokenizer", "TrainSettings", "USR_TOKEN", "check_tokenizer_matches",
           "load_tokenizer", "train_tokenizer"]
TRAINERS = ("sentencepiece", "rustbpe")


def load_tokenizer(path: str | os.PathLike, *, eos: int | str | None = None, bos: int | str | None = None,
                   separator: str | None = None, chat_template: str | os.PathLike | None = None) -> Tokenizer:
    """Open a tokenizer (module docstring). `eos`/`bos` (a token's text or id) override its own
    end/begin-of-text token; `separator`: "eos" (EOS after every document, the default) or "bos" (BOS before
    every document); `chat_template`: a jinja2 file for a sentencepiece model of its own conventions (Llama,
    Mistral). A model whose directory's meta.json records another sha256 is refused (a changed byte changes
    most ids)."""
    options = {"eos": eos, "bos": bos, "separator": separator}
    p = Path(path)
    spec = not p.exists() and is_tiktoken_spec(path)  # a tiktoken encoding name
    if not p.exists() and not spec and is_hub_id(str(path)):
        return load_tokenizer(hub_tokenizer_dir(str(path)), **options, chat_template=chat_template)
    if p.is_dir():
        for name in (MODEL_NAME, RANKS_NAME):
            if (p / name).is_file() and not (p / META_NAME).is_file():
                raise TokenizerError(f"{p}: {name} without meta.json: an interrupted train-tokenizer (it withdraws "
                                     f"meta.json first)? re-run it, or pass {p / name} to use the file as it is")
        for name in (MODEL_NAME, "tokenizer.json", RANKS_NAME):
            if (p / name).is_file():
                return load_tokenizer(p / name, **options, chat_template=chat_template)
        raise TokenizerError(f"{p}: no {MODEL_NAME} or tokenizer.json (or {RANKS_NAME}) in this directory; "
                             "train one with `train-tokenizer` or point --tokenizer at the model file")
    if chat_template is not None and (spec or p.suffix in (".json", ".tiktoken")):
        raise TokenizerError(f"{p}: --chat-template applies to sentencepiece models; a tokenizer.json takes its "
                             "template from the tokenizer_config.json beside it (its chat_template field)")
    if spec:
        return TiktokenTokenizer(path, **options)
    if p.suffix == ".json":
        tok = HFTokenizer(p, **options)
    elif p.suffix == ".tiktoken":
        tok = TiktokenTokenizer(p, **options)
    else:
        tok = SentencePieceTokenizer(p, **options, chat_template=chat_template)
    check_recorded_sha256(tok, p)
    return tok


HUB_FILES = ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"]


def is_hub_id(text: str) -> bool:
    """`owner/name` with no file suffix: a Hugging Face hub repository (when no such local path exists)."""
    parts = text.split("/")
    return len(parts) == 2 and all(parts) and not Path(text).suffix and not text.startswith(".")


def hub_tokenizer_dir(repo_id: str) -> Path:
    """The local snapshot of a hub tokenizer's files (downloaded once into the Hugging Face cache)."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:  # pragma: no cover - datasets depends on huggingface_hub
        raise TokenizerError(f"{repo_id}: a hub tokenizer needs `huggingface_hub` (pip install huggingface_hub)") from exc
    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_FILES))
    except Exception as exc:  # offline, unknown repository, gated repository: the hub's own message
        raise TokenizerError(f"{repo_id}: no such local path, and the Hugging Face hub repository could not be "
                             f"fetched ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                             "download its tokenizer.json and tokenizer_config.json into a directory and pass "
                             "that") from exc


def check_tokenizer_matches(tok: Tokenizer, recorded: str | None, what) -> None:
    """Refuse a tokenizer that is not the one `what` (a cache, a converted file, packed bins) records: its ids
    would decode to other text. `recorded` None (or all zeros: written without a tokenizer) checks nothing."""
    if recorded and set(str(recorded)) != {"0"} and recorded != tok.sha256:
        raise TokenizerError(f"{tok.model_path}: sha256 {tok.sha256[:16]}… but {what} was built with the tokenizer "
                             f"whose sha256 is {str(recorded)[:16]}…: its ids would decode to other text; pass the "
                             "tokenizer that built it")


def check_recorded_sha256(tok: Tokenizer, path: Path) -> None:
    """Refuse a model file whose sha256 is not the one its directory's meta.json records."""
    meta_file = path.parent / META_NAME
    try:
        meta = read_json(meta_file) if meta_file.is_file() else None
    except FormatError:
        return  # not our tokenizer meta; verify reports a damaged one
    if not meta or meta.get("kind") != "tokenizer" or meta.get("model_file", path.name) != path.name:
        return
    recorded = meta.get("tokenizer_sha256")
    if recorded and recorded != tok.sha256:
        raise TokenizerError(f"{path}: sha256 {tok.sha256[:16]}… but {meta_file} records {str(recorded)[:16]}…: the "
                             "model file was changed or damaged after training; retrain it (train-tokenizer) or copy "
                             "the original back")


def train_tokenizer(texts: Iterable[str], out_dir: str | os.PathLike, *, settings: TrainSettings | None = None,
                    trained_on: object = None, trainer: str = "sentencepiece") -> Tokenizer:
    """Train on `texts`, write out_dir/spm.model (trainer="rustbpe": out_dir/tokenizer.tiktoken, see
    niels_gpt.tokenizer.tiktoken_backend) then out_dir/meta.json, the commit marker."""
    settings = settings or TrainSettings()
    if trainer not in TRAINERS:
        raise TokenizerError(f"--trainer {trainer!r}: must be one of {', '.join(TRAINERS)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out)
    (out / META_NAME).unlink(missing_ok=True)  # not a finished tokenizer until the new meta lands
    if trainer == "rustbpe":
        tok, fields = train_rustbpe(texts, out, settings)
    else:
        model, stats = train_sentencepiece(texts, settings)
        write_bytes_atomic(out / MODEL_NAME, model)
        tok = SentencePieceTokenizer(out / MODEL_NAME)
        fields = {"settings": asdict(settings), "training_text": stats}
    write_meta(str(out), {"kind": "tokenizer", "format_version": 1, "model_file": Path(tok.model_path).name,
                          "tokenizer_sha256": tok.sha256, "vocab_size": len(tok), "bos_id": tok.bos_id,
                          "special_token_ids": dict(tok.special_ids), "special_tokens": dict(SPECIAL_TOKENS),
                          "trained_on": trained_on, **fields})
    return tok
