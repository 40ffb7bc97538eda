"""`train-tokenizer --trainer rustbpe`: a byte-level BPE trained by rustbpe, written as a `.tiktoken` tokenizer.

- rustbpe (the `tiktoken` extra) is nanochat's trainer: byte-level BPE over the GPT-4 split pattern, many
  times faster than sentencepiece's (docs/performance.md). `--vocab-size` ids: the 256 bytes, then the merges;
  the four special tokens come on top, so chats and assistant masks are those of the sentencepiece tokenizer.
- The directory holds `tokenizer.tiktoken` (base64 token, space, rank) and meta.json, written last, whose
  `tiktoken` record ({"pattern", "special_tokens"}) the loader reads back (tokenizer.tiktoken_backend).
- The training text is the sentencepiece trainer's (niels_gpt.tokenizer.spm.TrainingTexts). Same text and
  vocabulary size: the same file, byte for byte (rustbpe breaks ties between equally frequent pairs by the
  pair itself).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from pathlib import Path

from niels_gpt.atomic import write_bytes_atomic
from niels_gpt.errors import NielsGPTError, TokenizerError
from niels_gpt.tokenizer.special import SPECIAL_TOKENS
from niels_gpt.tokenizer.spm import TrainingTexts, TrainSettings
from niels_gpt.tokenizer.tiktoken_backend import CL100K_PATTERN, TiktokenTokenizer

RANKS_NAME = "tokenizer.tiktoken"
TRAINERS = ("sentencepiece", "rustbpe")
BYTES = 256


def check_rustbpe_settings(settings: TrainSettings) -> None:
    """What rustbpe cannot train, refused before any text is read."""
    if settings.vocab_size < BYTES:
        raise TokenizerError(f"--vocab-size {settings.vocab_size}: too small for --trainer rustbpe, whose "
                             f"vocabulary holds the {BYTES} single bytes before any merge; give at least "
                             f"{BYTES} (the {len(SPECIAL_TOKENS)} special tokens come on top); 4,000 to "
                             "64,000 are usual")
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


def train_rustbpe(texts: Iterable[str], out: Path, settings: TrainSettings) -> tuple[TiktokenTokenizer, dict]:
    """Train, write out/tokenizer.tiktoken; returns the tokenizer and what its meta.json records beside the
    fields of every tokenizer (niels_gpt.tokenizer.train_tokenizer writes it)."""
    check_rustbpe_settings(settings)
    try:
        import rustbpe
    except ImportError:
        raise TokenizerError("--trainer rustbpe needs the `rustbpe` package: pip install "
                             "'niels_gpt[tiktoken]' (or pip install rustbpe)") from None
    stats = {"documents": 0, "characters": 0, "truncated_at_max_train_chars": False}
    read = TrainingTexts(texts, settings, stats)
    trainer = rustbpe.Tokenizer()
    try:
        trainer.train_from_iterator(read, settings.vocab_size, pattern=CL100K_PATTERN)
    except UnicodeEncodeError as exc:
        raise read.surrogate(exc, near="near ") from None
    except NielsGPTError:
        raise
    except BaseException as exc:  # noqa: BLE001 - a Rust panic arrives as pyo3's PanicException (a BaseException)
        if isinstance(exc, (KeyboardInterrupt, SystemExit)) or type(exc).__name__ != "PanicException":
            raise
        raise TokenizerError(f"rustbpe training failed: {exc}") from None
    if not read.visible:
        raise read.nothing_visible()
    ranks = sorted(trainer.get_mergeable_ranks(), key=lambda kv: kv[1])
    stats["merges"] = len(ranks) - BYTES
    write_bytes_atomic(out / RANKS_NAME, b"".join(base64.b64encode(bytes(t)) + b" %d\n" % r
                                                  for t, r in ranks))
    # the four special tokens right after the last rank
    record = {"pattern": trainer.get_pattern(),
              "special_tokens": {text: len(ranks) + i for i, text in enumerate(SPECIAL_TOKENS.values())}}
    tok = TiktokenTokenizer(out / RANKS_NAME, record=record)
    kept = ("vocab_size", "max_train_chars", "seed", "max_chars", "doc_chars")  # rustbpe's settings
    return tok, {"trainer": "rustbpe", "tiktoken": record, "training_text": stats,
                 "settings": {k: getattr(settings, k) for k in kept}}
