"""`train-tokenizer --trainer rustbpe`: a byte-level BPE trained by rustbpe, written as a `.tiktoken` tokenizer.

    tok = train_rustbpe_tokenizer(texts, "tok", settings=TrainSettings(vocab_size=4000))
    tok = load_tokenizer("tok")     # a TiktokenTokenizer with the library's four chat tokens

- rustbpe (`pip install rustbpe`, in the `tiktoken` extra) is nanochat's trainer: byte-level BPE over the
  GPT-4 (cl100k) split pattern, many times faster than sentencepiece's trainer on the same text
  (docs/performance.md). The vocabulary is the 256 single bytes, then the merges, `--vocab-size` ids in all;
  the four special tokens come on top (ids vocab_size .. vocab_size+3), so chat rendering and the assistant
  masks are those of the sentencepiece tokenizer.
- The directory holds `tokenizer.tiktoken` (base64 token, space, rank) and meta.json, written last, which
  records the split pattern and the special tokens (`tiktoken`: {"pattern", "special_tokens"}) that the loader
  reads back (niels_gpt.tokenizer.tiktoken_backend).
- The training text is that of the sentencepiece trainer: every document up to --tokenizer-max-chars, or the
  seeded sample of --max-chars/--doc-chars (niels_gpt.tokenizer.sample). Same text and vocabulary size: the
  same file, byte for byte (rustbpe breaks ties between equally frequent pairs by the pair itself).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from pathlib import Path

from niels_gpt.atomic import write_bytes_atomic
from niels_gpt.errors import NielsGPTError, TokenizerError
from niels_gpt.meta import write_meta
from niels_gpt.tokenizer.sample import TrainingTexts
from niels_gpt.tokenizer.special import SPECIAL_TOKENS
from niels_gpt.tokenizer.spm import NoTrainingText, TrainSettings
from niels_gpt.tokenizer.tiktoken_backend import CL100K_PATTERN, TiktokenTokenizer

RANKS_NAME = "tokenizer.tiktoken"
TRAINERS = ("sentencepiece", "rustbpe")
BYTES = 256


def _rustbpe():
    try:
        import rustbpe
    except ImportError:
        raise TokenizerError("--trainer rustbpe needs the `rustbpe` package: pip install 'niels_gpt[tiktoken]' "
                             "(or pip install rustbpe)") from None
    return rustbpe


def check_rustbpe_settings(settings: TrainSettings, flag: str = "--vocab-size") -> None:
    """What rustbpe cannot train, refused before any text is read."""
    if settings.vocab_size < BYTES:
        raise TokenizerError(f"{flag} {settings.vocab_size}: too small for --trainer rustbpe, whose vocabulary holds "
                             f"the {BYTES} single bytes before any merge; give at least {BYTES} (the "
                             f"{len(SPECIAL_TOKENS)} special tokens come on top); 4,000 to 64,000 are usual")
    if settings.model_type != "bpe":
        raise TokenizerError(f"--model-type {settings.model_type} with --trainer rustbpe: rustbpe trains byte-level "
                             "BPE only; leave --model-type out, or use --trainer sentencepiece")
    default = TrainSettings()
    for flag, field in (("--character-coverage", "character_coverage"), ("--tokenizer-threads", "num_threads"),
                        ("--max-sentence-length", "max_sentence_length"), ("--no-split-digits", "split_digits")):
        if getattr(settings, field) != getattr(default, field):
            raise TokenizerError(f"{flag} is a sentencepiece setting: --trainer rustbpe has no such setting (it "
                                 "splits text with the GPT-4 pattern, on every core); leave it out, or use "
                                 "--trainer sentencepiece")


def train_rustbpe(texts: Iterable[str], settings: TrainSettings) -> tuple[bytes, str, dict]:
    """(the .tiktoken file's bytes, the split pattern, stats) of a BPE trained on `texts`."""
    check_rustbpe_settings(settings)
    rustbpe = _rustbpe()
    stats = {"documents": 0, "characters": 0, "truncated_at_max_train_chars": False}
    read = TrainingTexts(texts, settings, stats)

    trainer = rustbpe.Tokenizer()
    try:
        trainer.train_from_iterator(read, settings.vocab_size, pattern=CL100K_PATTERN)
    except UnicodeEncodeError as exc:
        raise TokenizerError(
            f"training text, near document {stats['documents']:,}: a lone surrogate "
            f"({exc.object[exc.start:exc.end]!r}) that no UTF-8 text can hold; fix the text (e.g. "
            "text.encode('utf-8', 'replace').decode() replaces it)") from None
    except NielsGPTError:
        raise
    except BaseException as exc:  # noqa: BLE001 - a Rust panic arrives as pyo3's PanicException (a BaseException)
        if isinstance(exc, (KeyboardInterrupt, SystemExit)) or type(exc).__name__ != "PanicException":
            raise
        raise TokenizerError(f"rustbpe training failed: {exc}") from None
    if not read.visible:
        if stats["documents"] == 0:
            raise NoTrainingText("no training text: every source was empty; give text to train on")
        raise NoTrainingText(f"no training text: the {stats['documents']:,} document(s) hold only whitespace "
                             f"({stats['characters']:,} characters); give text to train on")
    ranks = sorted(trainer.get_mergeable_ranks(), key=lambda kv: kv[1])
    data = b"".join(base64.b64encode(bytes(token)) + b" %d\n" % rank for token, rank in ranks)
    stats["merges"] = len(ranks) - BYTES
    return data, trainer.get_pattern(), stats


def special_token_ids(ranks: int) -> dict[str, int]:
    """The four special tokens' texts -> ids, right after the last rank."""
    return {text: ranks + i for i, text in enumerate(SPECIAL_TOKENS.values())}


def train_rustbpe_tokenizer(texts: Iterable[str], out: Path, *, settings: TrainSettings, trained_on: object):
    """Train, write out/tokenizer.tiktoken then out/meta.json (the commit marker); returns the tokenizer."""
    data, pattern, stats = train_rustbpe(texts, settings)
    write_bytes_atomic(out / RANKS_NAME, data)
    record = {"pattern": pattern, "special_tokens": special_token_ids(stats["merges"] + BYTES)}
    tok = TiktokenTokenizer(out / RANKS_NAME, record=record)
    write_meta(str(out), {
        "kind": "tokenizer",
        "format_version": 1,
        "model_file": RANKS_NAME,
        "trainer": "rustbpe",
        "tokenizer_sha256": tok.sha256,
        "vocab_size": len(tok),
        "special_token_ids": dict(tok.special_ids),
        "special_tokens": dict(SPECIAL_TOKENS),
        "bos_id": tok.bos_id,
        "tiktoken": record,
        "settings": {"vocab_size": settings.vocab_size, "max_train_chars": settings.max_train_chars,
                     "seed": settings.seed, "max_chars": settings.max_chars, "doc_chars": settings.doc_chars},
        "trained_on": trained_on,
        "training_text": stats,
    })
    return tok
