"""SentencePiece backend: training from any text iterator, and loading; and the training text either trainer
reads (`TrainingTexts`, with `sample_documents` for --max-chars).

The model has `vocab_size` ordinary pieces (unk, <s>, </s>, 256 byte pieces, the learned ones) plus the four
special tokens as control symbols (a user who types one gets plain text), 16,004 ids by default. Identity
normalisation and no dummy prefix, so decode(encode(text)) == text and the ids' bytes are the text's (bits per
byte needs them equal); byte fallback, so nothing is <unk>. The model depends on `num_threads`, so it is a
recorded setting with a fixed default: same corpus and settings, byte-identical spm.model.
"""

from __future__ import annotations

import hashlib
import heapq
import io
import os
import random
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path

import numpy as np

from niels_gpt.constants import SEED
from niels_gpt.errors import NielsGPTError, TokenizerError
from niels_gpt.tokenizer.base import Tokenizer
from niels_gpt.tokenizer.special import SPECIAL_TOKENS

MAX_SENTENCE_LENGTH = 16_384  # bytes per training chunk; longer paragraphs are cut at line ends
DOC_CHARS = 10_000  # characters kept of each document when sampling (nanochat's doc_cap)
MODEL_TYPES = ("bpe", "unigram")


@dataclass(frozen=True, kw_only=True)
class TrainSettings:
    vocab_size: int = 16_000  # ordinary pieces; the four specials come on top
    # bpe: 8-13x faster to train than unigram, and the fast encoder encodes it (docs/performance.md)
    model_type: str = "bpe"
    character_coverage: float = 0.9995
    num_threads: int = 4
    max_sentence_length: int = MAX_SENTENCE_LENGTH
    max_train_chars: int = 300_000_000  # stop reading the corpus after this many characters
    split_digits: bool = True
    seed: int = SEED
    max_chars: int | None = None  # --max-chars: a seeded sample of this many characters (sample_documents)
    doc_chars: int = DOC_CHARS  # --doc-chars: characters kept of each sampled document


class SentencePieceTokenizer(Tokenizer):
    backend = "sentencepiece"

    def __init__(self, model_path: str | os.PathLike, *, eos: int | str | None = None, bos: int | str | None = None,
                 separator: str | None = None, chat_template: str | os.PathLike | None = None):
        import sentencepiece as spm

        path = Path(model_path)
        if not path.is_file():
            raise TokenizerError(f"no sentencepiece model at {path}: train one with "
                                 "`python -m niels_gpt.cli train-tokenizer` or pass --tokenizer PATH")
        data = path.read_bytes()
        self._path, self._sha256 = str(path), hashlib.sha256(data).hexdigest()
        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.LoadFromSerializedProto(data)
        except Exception as exc:  # sentencepiece raises RuntimeError/OSError with a C++ message
            raise TokenizerError(f"{path}: not a sentencepiece model ({exc})") from exc
        found = {name: tid for name, piece in SPECIAL_TOKENS.items()
                 if (tid := self._sp.piece_to_id(piece)) != self._sp.unk_id() and self._sp.is_control(tid)}
        if len(found) == len(SPECIAL_TOKENS):
            self._special = found  # the library's own tokenizer: its four sentinels
        elif found:
            have = [SPECIAL_TOKENS[k] for k in found]
            lack = [text for k, text in SPECIAL_TOKENS.items() if k not in found]
            raise TokenizerError(f"{path}: holds the library's control pieces {', '.join(have)} but not "
                                 f"{', '.join(lack)}; retrain it with niels_gpt.tokenizer.train_tokenizer")
        else:  # any other sentencepiece model (Llama, Mistral, ...): its own <s> / </s>
            eos_id = self._sp.eos_id()
            self._special = {"sys": None, "usr": None, "asst": None, "eot": eos_id if eos_id >= 0 else None}
        self._template = self._read_template(path, chat_template)
        self._apply_options(eos, bos, separator)
        if chat_template is not None:
            self._options = {**self._options, "chat_template": str(chat_template)}

    def _read_template(self, path: Path, chat_template) -> str | None:
        """The chat template: --chat-template FILE, else a tokenizer_config.json (or chat_template.jinja) beside
        the model; none for the library's tokenizer, which renders chats with its sentinels."""
        if chat_template is not None:
            if self.library_conventions:
                raise TokenizerError(f"{path}: the library's tokenizer renders chats with its own sentinels; "
                                     "--chat-template applies to other tokenizers only: leave it out")
            try:
                return Path(chat_template).read_text("utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise TokenizerError(f"{chat_template}: cannot read this chat template "
                                     f"({getattr(exc, 'strerror', None) or exc}); --chat-template takes a jinja2 "
                                     "template file") from None
        if self.library_conventions:
            return None
        # lazy: the transformers-directory reader is needed only by models of their own conventions
        from niels_gpt.tokenizer.hf import read_config

        config, _ = read_config(path.parent)
        return config.get("chat_template")

    @property
    def chat_template(self) -> str | None:
        return self._template

    def encode_rendered_batch(self, texts: Sequence[str], threads: int | None = None) -> list[tuple]:
        """encode_rendered of each text (the model's control pieces written as text, `<s>`, `[INST]`, parsed as
        their ids), their plain parts in one call on `threads` threads (default: every core, one for one text;
        sentencepiece releases the GIL)."""
        if "_controls" not in self.__dict__:  # the control pieces, longest first, as one pattern: once
            # (a scan of the vocabulary: 16,000 calls for a 16k model)
            controls = sorted((self._sp.id_to_piece(i) for i in range(len(self))
                               if self._sp.is_control(i) and self._sp.id_to_piece(i)), key=len, reverse=True)
            self._controls = re.compile(f"({'|'.join(map(re.escape, controls))})") if controls else None
        split = [self._controls.split(text) if self._controls is not None else [text] for text in texts]
        plain = [part for parts in split for k, part in enumerate(parts) if not k % 2 and part]
        threads = threads or (os.cpu_count() or 1 if len(texts) > 1 else 1)
        try:  # sentencepiece 0.2.1+ (a list: on `threads` threads); before it, the immutable proto
            protos = iter(self._sp.encode(plain, return_type="proto", num_threads=threads) if threads > 1 else
                          [self._sp.encode(part, return_type="proto") for part in plain])
        except (TypeError, ValueError):
            protos = (self._sp.encode(part, out_type="immutable_proto") for part in plain)
        out = []
        for parts in split:
            ids: list[int] = []
            starts: list[int] = []
            pos = 0
            for k, part in enumerate(parts):  # text, control piece, text, ...
                if k % 2:
                    ids.append(self._sp.piece_to_id(part))
                    starts.append(pos)
                elif part:
                    # byte offset -> character offset within the part: the count of characters begun before it
                    data = np.frombuffer(part.encode("utf-8"), dtype=np.uint8)
                    chars = np.append(np.cumsum((data & 0xC0) != 0x80) - 1, len(part))
                    pieces = next(protos).pieces
                    ids += [piece.id for piece in pieces]
                    begins = np.minimum([piece.begin for piece in pieces], len(chars) - 1)
                    starts += (pos + chars[begins]).tolist()
                pos += len(part)
            out.append((ids, starts))
        return out

    def describe(self) -> dict:
        out = super().describe()
        if self._template is not None:
            out["chat_template_sha256"] = hashlib.sha256(self._template.encode("utf-8")).hexdigest()
        return out

    def __len__(self) -> int:
        return self._sp.get_piece_size()

    def _own_bos(self) -> int | None:
        bos = self._sp.bos_id()
        return None if bos < 0 else bos

    def token_to_id(self, token: str) -> int | None:
        tid = self._sp.piece_to_id(token)
        return None if tid == self._sp.unk_id() and token != self._sp.id_to_piece(tid) else tid

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text)

    def encode_batch(self, texts: Sequence[str], num_threads: int | None = None) -> list[list[int]]:
        # sentencepiece releases the GIL and splits the batch over its own threads; -1 = all cores.
        return self._sp.encode(list(texts), num_threads=-1 if num_threads is None else num_threads)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        ids = [int(i) for i in ids]
        if skip_special_tokens:
            return self._sp.decode(ids)
        # sentencepiece drops control symbols (ours, <s>, </s>) when decoding: decode the runs between
        # them and put each one back as its piece
        return "".join("".join(map(self._sp.id_to_piece, run)) if control else self._sp.decode(list(run))
                       for control, run in groupby(ids, self._sp.is_control))

    def id_to_piece(self, token_id: int) -> str:
        return self._sp.id_to_piece(int(token_id))

    def _count_byte_lengths(self) -> np.ndarray:
        sp = self._sp
        out = np.zeros(len(self), dtype=np.int32)
        for i in range(len(self)):
            if sp.is_control(i) or sp.is_unknown(i):
                continue
            if sp.is_byte(i):
                out[i] = 1
                continue
            # "▁" (U+2581) decodes to one space byte.
            out[i] = len(sp.id_to_piece(i).replace("\u2581", " ").encode("utf-8"))
        return out


def iter_training_chunks(texts: Iterable[str], max_bytes: int = MAX_SENTENCE_LENGTH) -> Iterator[str]:
    """Cut documents into paragraph chunks of at most max_bytes UTF-8 bytes, newlines kept inside chunks (so
    "\\n" is learned as a piece instead of falling back to a byte)."""
    for text in texts:
        for para in text.split("\n\n"):
            if not para.strip():
                continue
            para += "\n\n"
            if len(para.encode("utf-8")) <= max_bytes:
                yield para
                continue
            buf = ""
            for line in para.splitlines(keepends=True):
                while len(line.encode("utf-8")) > max_bytes:
                    cut = max_bytes // 4  # a char is at most 4 bytes, so this always fits
                    yield line[:cut]
                    line = line[cut:]
                if len((buf + line).encode("utf-8")) > max_bytes:
                    yield buf
                    buf = ""
                buf += line
            if buf:
                yield buf


class NoTrainingText(TokenizerError):
    """The training text was empty or whitespace only: a trainer has nothing to learn from."""


def sample_documents(texts: Iterable[str], max_chars: int, doc_chars: int = DOC_CHARS, seed: int = 0,
                     stats: dict | None = None) -> Iterator[str]:
    """With `--max-chars N`, a deterministic sample of `texts` from the whole input, each cut to its first
    `--doc-chars` characters (nanochat's 10,000-character cap per document, so that a few huge documents do not
    dominate the counts); `stats` gets the documents read and kept.

    Bottom-k sampling in one pass: document i draws key_i from random.Random(seed) in stream order; the sample
    is the documents of the smallest keys whose capped texts fit in N characters (a heap popped at its largest
    key while over N), given back in stream order. Every part of the input has the same chance whatever its
    position, and only the sample is held in memory."""
    rng = random.Random(seed)
    heap: list[tuple[float, int, str]] = []  # (-key, index, text): heap[0] is the largest key
    total = read = 0
    for i, text in enumerate(texts):
        read += 1
        key = rng.random()
        text = text[:doc_chars]
        if total + len(text) > max_chars and heap and -heap[0][0] < key:
            continue  # it would be the first to go
        heapq.heappush(heap, (-key, i, text))
        total += len(text)
        while total > max_chars and heap:
            total -= len(heapq.heappop(heap)[2])
    if stats is not None:
        stats.update(sampled_from_documents=read, sampled_documents=len(heap), sampled_characters=total)
    for _, _, text in sorted(heap, key=lambda e: e[1]):
        yield text


class TrainingTexts:
    """The texts either trainer reads (the `--max-chars` sample when asked for), stopped once `max_train_chars`
    characters were read, counted into `stats` (documents, characters, truncated_at_max_train_chars);
    `visible`: whether any text held a character that is not whitespace. Iterated once."""

    def __init__(self, texts: Iterable[str], settings, stats: dict):
        self.texts, self.settings, self.stats, self.visible = texts, settings, stats, False

    def __iter__(self) -> Iterator[str]:
        s, stats = self.settings, self.stats
        sample = self.texts if s.max_chars is None else sample_documents(self.texts, s.max_chars, s.doc_chars,
                                                                         s.seed, stats)
        for text in sample:
            if stats["characters"] >= s.max_train_chars:
                stats["truncated_at_max_train_chars"] = True
                return
            stats["documents"] += 1
            stats["characters"] += len(text)
            self.visible = self.visible or (text != "" and not text.isspace())
            yield text

    def nothing_visible(self) -> NoTrainingText:
        """The error to raise when no text held a visible character."""
        if self.stats["documents"] == 0:
            return NoTrainingText("no training text: every source was empty; give text to train on")
        return NoTrainingText(f"no training text: the {self.stats['documents']:,} document(s) hold only "
                              f"whitespace ({self.stats['characters']:,} characters); give text to train on")

    def surrogate(self, exc: UnicodeEncodeError, near: str = "") -> TokenizerError:
        """A lone surrogate in the text, which no UTF-8 text (and no trainer) can hold."""
        return TokenizerError(f"training text, {near}document {self.stats['documents']:,}: a lone surrogate "
                              f"({exc.object[exc.start:exc.end]!r}) that no UTF-8 text can hold; fix the "
                              "text (e.g. text.encode('utf-8', 'replace').decode() replaces it)")


MIN_VOCAB = 260  # ordinary pieces: the model always holds 256 byte pieces and 3 control pieces besides the 4 specials


def check_train_settings(settings: TrainSettings) -> None:
    """Every training setting checked before any text is read, each refusal naming its flag."""
    checks = (
        ("--vocab-size", settings.vocab_size, isinstance(settings.vocab_size, int) and settings.vocab_size >= MIN_VOCAB,
         f"must be at least {MIN_VOCAB}: the model always holds 256 byte pieces (nothing is ever <unk>) and 3 control "
         "pieces, plus one piece per character of the text; 4,000 to 64,000 are usual"),
        ("--model-type", settings.model_type, settings.model_type in MODEL_TYPES, "use bpe or unigram"),
        ("--max-chars", settings.max_chars, settings.max_chars is None or settings.max_chars >= 1,
         "must be >= 1 characters (leave it out to train on every document)"),
        ("--doc-chars", settings.doc_chars, settings.doc_chars >= 1, "must be >= 1 characters a document"),
        ("--character-coverage", settings.character_coverage, 0 < settings.character_coverage <= 1,
         "must be in (0, 1], e.g. 0.9995"),
        ("--tokenizer-threads", settings.num_threads, settings.num_threads >= 1, "must be >= 1"),
        ("--tokenizer-max-chars", settings.max_train_chars, settings.max_train_chars >= 1, "must be >= 1"),
        ("--max-sentence-length", settings.max_sentence_length, settings.max_sentence_length >= 16,
         "must be at least 16 bytes"),
    )
    for flag, value, ok, fix in checks:
        if not ok:
            raise TokenizerError(f"{flag} {value!r}: {fix}")


class VocabSizeError(TokenizerError):
    """The vocabulary size does not fit the text (too small for its characters, or more than it can fill);
    `for_flag` says it again for the flag that set the size."""

    def __init__(self, settings: TrainSettings, *, need: int | None = None, most: int | None = None,
                 flag: str = "--vocab-size", coverage_flag: str | None = "--character-coverage"):
        self.settings, self.need, self.most = settings, need, most
        v = settings.vocab_size
        if need is not None:
            lower = f", or lower {coverage_flag}" if coverage_flag else ""
            text = (f"{flag} {v} is too small for this text: it needs {need} pieces at least (256 byte pieces, 3 "
                    f"control pieces and one per character kept by character coverage {settings.character_coverage})"
                    f"; raise {flag} to {need} or more{lower}")
        else:
            text = (f"{flag} {v} is more than this text can fill: at most {most} pieces here; lower {flag} or train on "
                    "more text")
        super().__init__(text)

    def for_flag(self, flag: str, coverage_flag: str | None) -> VocabSizeError:
        return VocabSizeError(self.settings, need=self.need, most=self.most, flag=flag, coverage_flag=coverage_flag)


def _training_failure(exc: RuntimeError, settings: TrainSettings) -> TokenizerError:
    """sentencepiece's own message, turned into what to change."""
    text = str(exc)
    small = re.search(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)", text)
    if small:
        return VocabSizeError(settings, need=int(small.group(2)) - len(SPECIAL_TOKENS))
    big = re.search(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)", text)
    if big:
        return VocabSizeError(settings, most=int(big.group(2)) - len(SPECIAL_TOKENS))
    return TokenizerError(f"sentencepiece training failed: {text}")


def train_sentencepiece(texts: Iterable[str], settings: TrainSettings = TrainSettings()) -> tuple[bytes, dict]:
    """Train a model; returns (model bytes, stats). Deterministic for the same texts and settings."""
    import sentencepiece as spm

    check_train_settings(settings)
    stats = {"documents": 0, "characters": 0, "chunks": 0, "truncated_at_max_train_chars": False}
    read = TrainingTexts(texts, settings, stats)  # .visible: sentencepiece drops blank sentences
    failure: list[Exception] = []  # a lone surrogate, or an error of the input's reader

    def chunks() -> Iterator[str]:
        try:
            for chunk in iter_training_chunks(read, settings.max_sentence_length):
                stats["chunks"] += 1
                yield chunk
        except UnicodeEncodeError as exc:  # raised inside sentencepiece it would come back as its INTERNAL error
            failure.append(read.surrogate(exc))
        except NielsGPTError as exc:  # a bad record of the input: its own message, not sentencepiece's INTERNAL
            failure.append(exc)

    model = io.BytesIO()
    spm.set_random_generator_seed(settings.seed)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=chunks(), model_writer=model, minloglevel=2, input_sentence_size=0,
            vocab_size=settings.vocab_size + len(SPECIAL_TOKENS), model_type=settings.model_type,
            character_coverage=settings.character_coverage, num_threads=settings.num_threads,
            max_sentence_length=settings.max_sentence_length, split_digits=settings.split_digits,
            byte_fallback=True, control_symbols=list(SPECIAL_TOKENS.values()),
            unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
            # lossless: decode(encode(text)) == text, and no space prepended to every text
            normalization_rule_name="identity", remove_extra_whitespaces=False, add_dummy_prefix=False,
            allow_whitespace_only_pieces=True,
        )
    except RuntimeError as exc:
        if failure or not read.visible:
            raise (failure[0] if failure else read.nothing_visible()) from None
        raise _training_failure(exc, settings) from exc
    if failure or not read.visible:
        raise failure[0] if failure else read.nothing_visible()
    return model.getvalue(), stats
