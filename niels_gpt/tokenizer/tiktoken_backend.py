"""tiktoken backend: an encoding by name (cl100k_base, o200k_base, ...) or a local `.tiktoken` file.

    tok = TiktokenTokenizer("cl100k_base")          # needs the encoding's file in tiktoken's cache
    tok = TiktokenTokenizer("my_ranks.tiktoken")    # base64 token, space, rank: one per line

- A name is opened with `tiktoken.get_encoding` (its cache, TIKTOKEN_CACHE_DIR; a download only when missing).
- A `.tiktoken` file that is one of OpenAI's published encodings (recognised by its sha256, `PUBLISHED`) is
  that encoding exactly as the name gives it (regex, special tokens, sha256), so a cache built from the file
  offline is the cache built from the name. A file trained here (`train-tokenizer --trainer rustbpe`) takes its
  regex and the library's special tokens from the meta.json beside it. Any other file gets o200k's regex
  (a file name holding "o200k") or cl100k's, and one special token, `<|endoftext|>`, after the last rank.
- Literal special strings in text stay text (`encode_ordinary`); tiktoken has no chat template.
- sha256: of the `.tiktoken` file, or for a name (and a published file) of its ranks, regex and special
  tokens, so two machines with the same encoding record the same value.

`train-tokenizer --trainer rustbpe` (`train_rustbpe`): a byte-level BPE trained by rustbpe, written as a
`.tiktoken` tokenizer.
- rustbpe (the `tiktoken` extra) is nanochat's trainer: byte-level BPE over the GPT-4 split pattern, many
  times faster than sentencepiece's (docs/performance.md). `--vocab-size` ids: the 256 bytes, then the merges;
  the four special tokens come on top, so chats and assistant masks are those of the sentencepiece tokenizer.
- The directory holds `tokenizer.tiktoken` (base64 token, space, rank) and meta.json, written last, whose
  `tiktoken` record ({"pattern", "special_tokens"}) the loader reads back (`recorded_encoding`).
- The training text is the sentencepiece trainer's (niels_gpt.tokenizer.spm.TrainingTexts). Same text and
  vocabulary size: the same file, byte for byte (rustbpe breaks ties between equally frequent pairs by the
  pair itself).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from niels_gpt.atomic import write_bytes_atomic
from niels_gpt.constants import META_NAME
from niels_gpt.errors import NielsGPTError, TokenizerError, first_few
from niels_gpt.seals import RECORD_SEAL, is_sealed, seal_problem
from niels_gpt.tokenizer.base import Tokenizer
from niels_gpt.tokenizer.special import SPECIAL_TOKENS
from niels_gpt.tokenizer.spm import TrainingTexts, TrainSettings

ENDOFTEXT = "<|endoftext|>"
CL100K_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
                  r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s""")
O200K_PATTERN = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""", r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""", r"""\s*[\r\n]+""", r"""\s+(?!\S)""", r"""\s+""",
])

R50K_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""

# sha256 of a published .tiktoken file (as tiktoken_ext.openai_public checks it) -> (name, regex, special tokens)
PUBLISHED = {
    "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930":
        ("r50k_base", R50K_PATTERN, {ENDOFTEXT: 50256}),
    "94b5ca7dff4d00767bc256fdd1b27e5b17361d7b8a5f968547f9f23eb70d2069":
        ("p50k_base", R50K_PATTERN, {ENDOFTEXT: 50256}),
    "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7":
        ("cl100k_base", CL100K_PATTERN, {ENDOFTEXT: 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259,
                                         "<|fim_suffix|>": 100260, "<|endofprompt|>": 100276}),
    "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d":
        ("o200k_base", O200K_PATTERN, {ENDOFTEXT: 199999, "<|endofprompt|>": 200018}),
}


_BASE64 = re.compile(rb"[A-Za-z0-9+/]*={0,2}")


def parse_ranks(data: bytes, path: Path) -> dict[bytes, int]:
    """The ranks of a .tiktoken file's bytes, as tiktoken's `load_tiktoken_bpe` reads them; an error names the
    line at fault.

    NOTE: not `load_tiktoken_bpe(path)` itself: its download cache keys local paths too (sha1 of the path), so
    it copied every file into the cache and served the first version of a path after the file was replaced.
    NOTE: tiktoken's encoder panics (a Rust panic, at encode time) on a rank given twice and on a missing single
    byte: both are refused here, before any text is encoded.
    """
    lines = [line for line in data.splitlines() if line]
    try:  # a sound file in one pass (200k ranks: 0.09 s, line by line 0.21 s); else the lines below name the fault
        ranks = {binascii.a2b_base64(t, strict_mode=True): int(r) for t, r in (line.split() for line in lines)}
    except (ValueError, TypeError):  # binascii.Error is a ValueError; TypeError: Python 3.10 has no strict_mode
        ranks = {}
    if (len(ranks) != len(lines) or len(set(ranks.values())) != len(ranks) or b"" in ranks
            or min(ranks.values(), default=0) < 0):
        ranks = _ranks_line_by_line(data, path)
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if ranks and missing:
        shown = first_few([f"0x{b:02x}" for b in missing], 6)
        raise TokenizerError(f"{path}: no rank for the single byte(s) {shown} ({len(missing)} of 256); a byte-level "
                             "BPE must rank every single byte, or some text cannot be encoded at all")
    return ranks


def _ranks_line_by_line(data: bytes, path: Path) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    ranked: dict[int, int] = {}  # rank -> the line that gave it
    for number, line in enumerate(data.splitlines(), 1):
        if not line:
            continue
        try:
            token_text, rank_text = line.split()
            if _BASE64.fullmatch(token_text) is None:  # what base64.b64decode(validate=True) refuses
                raise binascii.Error("not base64")
            token, rank = binascii.a2b_base64(token_text), int(rank_text)
        except (ValueError, binascii.Error) as exc:
            raise TokenizerError(f"{path}: not a .tiktoken file (base64 token, space, rank per line): line "
                                 f"{number}: {line[:60]!r} ({exc})") from exc
        where = f"{path}: line {number}"
        if not token or rank < 0:
            raise TokenizerError(f"{where}: {'an empty token' if not token else f'rank {rank} below 0'}; "
                                 "every line must rank a non-empty token from 0 up")
        if token in ranks:
            raise TokenizerError(f"{where}: token {token!r} was already ranked on line {ranked[ranks[token]]}; each "
                                 "token must appear once: the file is damaged or not a .tiktoken file")
        if rank in ranked:
            raise TokenizerError(f"{where}: rank {rank} was already given on line {ranked[rank]}; each rank must "
                                 "appear once: the file is damaged or not a .tiktoken file")
        ranks[token], ranked[rank] = rank, number
    return ranks


def encoding_sha256(enc) -> str:
    """One hash of a tiktoken Encoding: its ranks, regex and special tokens (the same on every machine)."""
    h = hashlib.sha256()
    h.update(enc._pat_str.encode())
    for token, rank in sorted(enc._mergeable_ranks.items(), key=lambda kv: kv[1]):
        h.update(rank.to_bytes(4, "little") + len(token).to_bytes(2, "little") + token)
    for token, rank in sorted(enc._special_tokens.items()):
        h.update(token.encode() + rank.to_bytes(4, "little"))
    return h.hexdigest()


def recorded_encoding(path: Path) -> dict | None:
    """The split pattern and special tokens that the meta.json beside a trained `.tiktoken` file records
    ({"pattern": str, "special_tokens": {text: id}}), or None."""
    import json

    meta_path = path.parent / META_NAME
    try:
        data = meta_path.read_bytes()
    except FileNotFoundError:
        return None  # a .tiktoken file of its own, not one the library trained
    except OSError as exc:
        raise TokenizerError(f"{meta_path}: cannot read it ({exc.strerror or exc}); check its permissions") from None
    try:
        meta = json.loads(data)
    except ValueError:
        raise TokenizerError(f"{meta_path}: not valid JSON (damaged after it was written); retrain the tokenizer "
                             "(train-tokenizer --trainer rustbpe)") from None
    if not isinstance(meta, dict) or meta.get("kind") != "tokenizer" or meta.get("model_file") != path.name:
        return None
    fix = "retrain it (train-tokenizer --trainer rustbpe); `verify` names what changed"
    problem = seal_problem(meta_path, data, meta, fix) if is_sealed(meta) else \
        f"{meta_path}: it carries no {RECORD_SEAL} (every trained tokenizer's record does): {fix}"
    if problem:  # its pattern and special tokens decide every id: an edited record is not used
        raise TokenizerError(problem)
    record = meta.get("tiktoken")
    if not isinstance(record, dict) or not isinstance(record.get("pattern"), str) or \
            not isinstance(record.get("special_tokens"), dict) or \
            not all(isinstance(v, int) for v in record["special_tokens"].values()):
        raise TokenizerError(f"{meta_path}: its `tiktoken` record (the split pattern and special "
                             "tokens of this tokenizer) is missing or damaged; retrain it (train-tokenizer "
                             "--trainer rustbpe)")
    return record


def is_tiktoken_spec(path: str | os.PathLike) -> bool:
    """A `.tiktoken` file, or a bare name tiktoken knows (cl100k_base, o200k_base, gpt2, ...)."""
    text = str(path)
    if text.endswith(".tiktoken"):
        return True
    if os.sep in text or "/" in text or Path(text).exists():
        return False
    try:
        import tiktoken
    except ImportError:
        return text.endswith("_base")
    return text in tiktoken.list_encoding_names()


class TiktokenTokenizer(Tokenizer):
    backend = "tiktoken"
    # two threads in one process encode 1.2-1.4x one thread's rate, two processes 1.9x (encode_pool.py)
    encode_in_processes = True

    def __init__(self, path: str | os.PathLike, *, eos: int | str | None = None, bos: int | str | None = None,
                 separator: str | None = None, record: dict | None = None):
        try:
            import tiktoken
        except ImportError as exc:  # pragma: no cover - the tiktoken extra is not installed
            raise TokenizerError(f"{path}: a tiktoken encoding needs the `tiktoken` package: pip install "
                                 "'niels_gpt[tiktoken]'") from exc
        text = str(path)
        if text.endswith(".tiktoken"):
            p = Path(text)
            if not p.is_file():
                raise TokenizerError(f"no .tiktoken file at {p}; pass an existing file or an encoding name")
            data = p.read_bytes()
            ranks = parse_ranks(data, p)
            if not ranks:
                raise TokenizerError(f"{p}: no ranks in this .tiktoken file")
            file_sha256 = hashlib.sha256(data).hexdigest()
            published = PUBLISHED.get(file_sha256)
            record = record if record is not None else recorded_encoding(p)
            if published is not None:  # the encoding of that name, offline
                name, pattern, specials = published
            elif record is not None:  # trained here (train_rustbpe): its pattern and special tokens
                name, pattern, specials = p.stem, record["pattern"], dict(record["special_tokens"])
            else:
                pattern = O200K_PATTERN if "o200k" in p.name else CL100K_PATTERN
                name, specials = p.stem, {ENDOFTEXT: max(ranks.values()) + 1}
            try:
                self._enc = tiktoken.Encoding(name=name, pat_str=pattern, mergeable_ranks=ranks,
                                              special_tokens=specials)
            except Exception as exc:
                raise TokenizerError(f"{p}: tiktoken refused these ranks: {exc}") from exc
            self._sha256 = encoding_sha256(self._enc) if published is not None else file_sha256
        else:
            try:
                self._enc = tiktoken.get_encoding(text)
            except ValueError as exc:
                raise TokenizerError(f"{text!r}: not a tiktoken encoding name ({exc}); pass one of "
                                     f"{tiktoken.list_encoding_names()} or a .tiktoken file") from exc
            except Exception as exc:  # the download of a missing file failed (no network)
                cache = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR") or \
                    os.path.join(__import__("tempfile").gettempdir(), "data-gym-cache")
                raise TokenizerError(f"tiktoken encoding {text!r} is not in its cache ({cache}) and could not be "
                                     f"downloaded ({type(exc).__name__}: {exc}); copy the encoding's file there "
                                     "(or set TIKTOKEN_CACHE_DIR), or pass a local .tiktoken file") from exc
            self._sha256 = encoding_sha256(self._enc)
        self._path = text
        self._special_set = set(self._enc._special_tokens.values())
        eot = self._enc._special_tokens.get(ENDOFTEXT)
        self._special = {"sys": None, "usr": None, "asst": None, "eot": eot}
        if all(t in self._enc._special_tokens for t in SPECIAL_TOKENS.values()):  # the library's four chat tokens
            self._special = {k: self._enc._special_tokens[t] for k, t in SPECIAL_TOKENS.items()}
        self._apply_options(eos, bos, separator)

    def __len__(self) -> int:
        return self._enc.max_token_value + 1

    def token_to_id(self, token: str) -> int | None:
        if token in self._enc._special_tokens:
            return self._enc._special_tokens[token]
        return self._enc._mergeable_ranks.get(token.encode("utf-8"))

    def encode(self, text: str) -> list[int]:
        return self._enc.encode_ordinary(text)

    def encode_batch(self, texts: Sequence[str], num_threads: int | None = None) -> list[list[int]]:
        # one call into Rust for the batch (the GIL is released while it encodes)
        if num_threads is None or num_threads <= 1:
            return [self._enc.encode_ordinary(t) for t in texts]
        return self._enc.encode_ordinary_batch(list(texts), num_threads=num_threads)

    def encode_batch_arrays(self, texts: Sequence[str]) -> list[np.ndarray]:
        """The ids of `encode` for each text as a uint32 array, read from tiktoken's own buffer: no Python
        int per token (what the cache builder asks for; niels_gpt.long_documents.encode_documents)."""
        core = self._enc._core_bpe
        if not hasattr(core, "encode_to_tiktoken_buffer"):  # an older tiktoken
            return [np.array(self.encode(t), dtype=np.uint32) for t in texts]
        allowed: set = set()  # no special token: their text is encoded as text, exactly as encode_ordinary does
        out = []
        for text in texts:
            try:
                buf = core.encode_to_tiktoken_buffer(text, allowed)
            except UnicodeEncodeError:  # lone surrogates: replaced, as tiktoken's encode_ordinary does
                buf = core.encode_to_tiktoken_buffer(
                    text.encode("utf-16", "surrogatepass").decode("utf-16", "replace"), allowed)
            out.append(np.frombuffer(buf, dtype=np.uint32))
        return out

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        ids = [int(i) for i in ids]
        if skip_special_tokens:
            ids = [i for i in ids if i not in self._special_set]
        return self._enc.decode(ids)

    def id_to_piece(self, token_id: int) -> str:
        try:
            return self._enc.decode_single_token_bytes(int(token_id)).decode("utf-8", errors="backslashreplace")
        except KeyError as exc:
            raise TokenizerError(f"{self._path}: id {token_id} is not in the vocabulary (0..{len(self) - 1})") from exc

    def _count_byte_lengths(self) -> np.ndarray:
        out = np.zeros(len(self), dtype=np.int32)
        for token, rank in self._enc._mergeable_ranks.items():
            out[rank] = len(token)
        return out


RANKS_NAME = "tokenizer.tiktoken"
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
