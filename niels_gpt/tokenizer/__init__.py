"""Tokenizers: sentencepiece (trained here), Hugging Face `tokenizers` and tiktoken, one interface.

    tok = load_tokenizer("cache/tokenizer")          # dir with spm.model (or tokenizer.tiktoken), or a .model/.json file
    tok = load_tokenizer("hf_dir")                   # tokenizer.json (+ tokenizer_config.json)
    tok = load_tokenizer("cl100k_base")              # or "ranks.tiktoken"
    ids = tok.encode("hello")                        # literal special strings stay text
    chat = tok.render_chat([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])
    chat.ids, chat.mask                              # mask: the assistant's trained tokens
    tok.separator                                    # the document separator: Separator(token, id, position)

What `path` is picks the backend: a directory (spm.model, else tokenizer.json, else the tokenizer.tiktoken of
`train-tokenizer --trainer rustbpe`), a `.model` file
(sentencepiece), a `.json` file (Hugging Face), a `.tiktoken` file or a tiktoken encoding name.
A tokenizer other than the library's keeps its own conventions (niels_gpt.tokenizer.base).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from niels_gpt.atomic import remove_stale_temporaries, write_bytes_atomic
from niels_gpt.constants import META_NAME, MODEL_NAME
from niels_gpt.errors import TokenizerError
from niels_gpt.meta import write_meta
from niels_gpt.tokenizer.base import (
    SEPARATOR_CHOICES,
    Message,
    RenderedChat,
    Separator,
    Tokenizer,
    token_dtype_for,
)
from niels_gpt.tokenizer.bpe import RANKS_NAME, TRAINERS, train_rustbpe_tokenizer
from niels_gpt.tokenizer.hf import HFTokenizer
from niels_gpt.tokenizer.special import (
    ASST_TOKEN,
    EOT_TOKEN,
    ROLES,
    SPECIAL_TOKENS,
    SYS_TOKEN,
    USR_TOKEN,
)
from niels_gpt.tokenizer.spm import SentencePieceTokenizer, TrainSettings, settings_dict, train_sentencepiece
from niels_gpt.tokenizer.tiktoken_backend import TiktokenTokenizer, is_tiktoken_spec

__all__ = [
    "ASST_TOKEN", "EOT_TOKEN", "MODEL_NAME", "Message", "ROLES", "RenderedChat", "SEPARATOR_CHOICES",
    "SPECIAL_TOKENS", "SYS_TOKEN", "Separator", "SentencePieceTokenizer", "Tokenizer", "TrainSettings", "USR_TOKEN",
    "load_tokenizer", "token_dtype_for", "train_tokenizer",
]


def load_tokenizer(path: str | os.PathLike, *, eos: int | str | None = None, bos: int | str | None = None,
                   separator: str | None = None, chat_template: str | os.PathLike | None = None) -> Tokenizer:
    """Open a tokenizer: a directory holding spm.model (or tokenizer.json), the file itself, a `.tiktoken`
    file or a tiktoken encoding name.

    `eos`/`bos` (a token's text or its id) override the tokenizer's own end/begin-of-text token;
    `separator` "eos" (the default: EOS after every document) or "bos" (BOS before every document);
    `chat_template`: a jinja2 template file for a sentencepiece model of its own conventions (Llama, Mistral),
    else the `chat_template` of a tokenizer_config.json beside the model.

    Where a tokenizer directory's meta.json records the model's sha256 (ours always does), the file must
    match it: a changed byte in a model file still loads and silently changes most ids. The hash is the
    one every tokenizer computes on load, so the check costs nothing more.
    """
    options = {"eos": eos, "bos": bos, "separator": separator}
    if chat_template is not None:
        options["chat_template"] = chat_template
    p = Path(path)
    if not p.exists():
        if is_tiktoken_spec(path):
            if chat_template is not None:
                raise TokenizerError(f"{path}: --chat-template applies to sentencepiece models, not tiktoken encodings")
            return TiktokenTokenizer(path, **options)
        if is_hub_id(str(path)):
            return load_tokenizer(hub_tokenizer_dir(str(path)), **options)
    if p.is_dir():
        for name in (MODEL_NAME, RANKS_NAME):
            if (p / name).is_file() and not (p / META_NAME).is_file():
                raise TokenizerError(f"{p}: {name} without meta.json: an interrupted train-tokenizer (it withdraws "
                                     f"meta.json first)? re-run it, or pass {p / name} to use the file as it is")
        for name in (MODEL_NAME, "tokenizer.json", RANKS_NAME):
            if (p / name).is_file():
                return load_tokenizer(p / name, **options)
        raise TokenizerError(f"{p}: no {MODEL_NAME} or tokenizer.json (or {RANKS_NAME}) in this directory; "
                             "train one with `train-tokenizer` or point --tokenizer at the model file")
    if chat_template is not None and p.suffix in (".json", ".tiktoken"):
        raise TokenizerError(f"{p}: --chat-template applies to sentencepiece models; a tokenizer.json takes its "
                             "template from the tokenizer_config.json beside it (its chat_template field)")
    if p.suffix == ".json":
        tok = HFTokenizer(p, **options)
    elif p.suffix == ".tiktoken":
        tok = TiktokenTokenizer(p, **options)
    else:
        tok = SentencePieceTokenizer(p, **options)
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
    """Refuse a tokenizer that is not the one `what` (a cache, a converted file, packed bins) records.

    Two tokenizers of the same size give the same ids different text, so a mismatch would decode or score
    garbage without any error. `recorded` None (or all zeros: written without a tokenizer) checks nothing.
    """
    if recorded and set(str(recorded)) != {"0"} and recorded != tok.sha256:
        raise TokenizerError(f"{tok.model_path}: sha256 {tok.sha256[:16]}… but {what} was built with the tokenizer "
                             f"whose sha256 is {str(recorded)[:16]}…: its ids would decode to other text; pass the "
                             "tokenizer that built it")


def check_recorded_sha256(tok: Tokenizer, path: Path) -> None:
    """Refuse a model file whose sha256 is not the one its directory's meta.json records."""
    import json

    meta_file = path.parent / META_NAME
    if not meta_file.is_file():
        return
    try:
        meta = json.loads(meta_file.read_text("utf-8"))
    except (OSError, ValueError):
        return  # not our tokenizer meta; verify reports a damaged one
    if not isinstance(meta, dict) or meta.get("kind") != "tokenizer" or meta.get("model_file", path.name) != path.name:
        return
    recorded = meta.get("tokenizer_sha256")
    if recorded and recorded != tok.sha256:
        raise TokenizerError(f"{path}: sha256 {tok.sha256[:16]}… but {meta_file} records {str(recorded)[:16]}…: the "
                             "model file was changed or damaged after training; retrain it (train-tokenizer) or copy "
                             "the original back")


def train_tokenizer(texts: Iterable[str], out_dir: str | os.PathLike, *, settings: TrainSettings | None = None,
                    trained_on: object = None, trainer: str = "sentencepiece") -> Tokenizer:
    """Train on `texts`, write out_dir/spm.model then out_dir/meta.json (the commit marker); with
    trainer="rustbpe", out_dir/tokenizer.tiktoken then meta.json (niels_gpt.tokenizer.bpe)."""
    settings = settings or TrainSettings()
    if trainer not in TRAINERS:
        raise TokenizerError(f"--trainer {trainer!r}: must be one of {', '.join(TRAINERS)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out)
    stale = out / META_NAME
    if stale.exists():
        stale.unlink()  # the directory is not a finished tokenizer until the new meta lands
    if trainer == "rustbpe":
        return train_rustbpe_tokenizer(texts, out, settings=settings, trained_on=trained_on)
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
