"""What every source shares: the two base classes, file reading, the seeded file split, `datasets` rows.

- `TextSource.iter_texts(split)` yields `str` documents; `ChatSource.iter_conversations()` yields
  `list[Message]`. Both are lazy: a source holds paths and settings, never the corpus.
- Skipped records are counted by reason in `source.skipped` (a Counter) while iterating; the count
  accumulates over every iteration of that source object, and `describe()` reports it.
- Local files are decoded strictly as UTF-8: a bad byte is a `SourceError` naming the file, the byte
  offset and the line, never a silent replacement character.
- Hub-backed sources read through `datasets.load_dataset(..., streaming=True)`; local files of the
  same schema take the same call with a packaged builder ("parquet", "json", "text").
"""

from __future__ import annotations

import collections
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from niels_gpt.constants import (
    SEED,  # noqa: F401  (re-exported under its old name)
    SPLITS,
)
from niels_gpt.errors import ConfigError, SourceError
from niels_gpt.tokenizer.base import Message


def _drop_json_reader_errors(record: logging.LogRecord) -> bool:
    """`datasets` logs "Failed to load JSON from file ..." before raising; the error it raises is then
    explained here by file and line (`_raise_local_file_problem`), so the log line is only noise."""
    return not str(record.msg).startswith("Failed to load JSON from file")


logging.getLogger("datasets.packaged_modules.json.json").addFilter(_drop_json_reader_errors)

SAMPLE_DIR = Path(__file__).resolve().parent / "sample"
SAMPLE_PREFIX = "sample:"  # how describe() names bundled files, so meta.json is the same on every clone
VAL_FRAC = 0.1

# Local file suffix -> the `datasets` packaged builder that reads it.
BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".txt": "text", ".raw": "text"}
TEXT_SUFFIXES = (".txt", ".raw", ".jsonl", ".json", ".md")  # files worth scanning for bad UTF-8


class _Source:
    """What every source shares: skipped-record counts, the files it reads, and describe()."""

    name: str = "source"
    dataset_id: str | None = None
    dataset_config: str | None = None
    streaming: bool = False
    split_rule: str = ""

    def __init__(self) -> None:
        self.skipped: collections.Counter[str] = collections.Counter()

    def files(self) -> list[str]:
        return []

    def input_paths(self) -> list[Path]:
        """The local files this source reads (empty for a hub stream): what a progress bar sizes."""
        return [Path(f) for f in self.files()]

    def describe(self) -> dict[str, Any]:
        """JSON-able facts for meta.json: what was read, how it was split, what was skipped."""
        return {
            "name": self.name,
            "dataset_id": self.dataset_id,
            "dataset_config": self.dataset_config,
            "files": [portable(f) for f in self.files()],
            "streaming": self.streaming,
            "split_rule": self.split_rule,
            "skipped": dict(sorted(self.skipped.items())),
            **self._describe_extra(),
        }

    def _describe_extra(self) -> dict[str, Any]:
        return {}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} files={len(self.files())}>"


class TextSource(_Source):
    """A lazy iterator of pretraining documents. Subclasses implement `_iter_split`."""

    name: str = "text"
    own_split: bool = False

    def iter_texts(self, split: str | None = None) -> Iterator[str]:
        """Documents in order. split=None: every document (own-split sources: train, then val);
        "train"/"val": that split, only for sources with a split of their own."""
        if split is None:
            yield from self._iter_split(None)
            return
        if split not in SPLITS:
            raise ConfigError(f"{self.name}: unknown split {split!r}; use one of {SPLITS} or None")
        if not self.own_split:
            raise ConfigError(f"{self.name} has no train/val split of its own (the cache builder "
                              "splits it); call iter_texts() with split=None")
        yield from self._iter_split(split)

    def _iter_split(self, split: str | None) -> Iterator[str]:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "own_split": self.own_split}


class ChatSource(_Source):
    """A lazy iterator of SFT conversations (`list[Message]`, each with an assistant turn)."""

    name: str = "chat"
    split_rule = "none: the SFT cache builder splits by example (seeded val_frac)"

    def iter_conversations(self) -> Iterator[list[Message]]:
        raise NotImplementedError


# ---------------------------------------------------------------------------------------------
# Files


def as_paths(paths: str | os.PathLike | Sequence[str | os.PathLike], what: str) -> list[Path]:
    """One path or several -> list of existing paths (SourceError for a missing one)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out = [Path(p) for p in paths]
    if not out:
        raise ConfigError(f"{what}: no files given; pass at least one path")
    for p in out:
        if not p.exists():
            raise SourceError(f"{p}: no such file or directory ({what}); check the path")
    return out


def list_files(directory: str | os.PathLike, suffix: str, what: str) -> list[Path]:
    """Every `*{suffix}` file under `directory` (recursive, dot-files excluded), sorted by relative path."""
    d = Path(directory)
    if not d.is_dir():
        raise SourceError(f"{d}: no such directory ({what}); pass the directory that holds the "
                          f"{suffix} files")
    found = files_under(d, lambda p: p.name.endswith(suffix))
    if not found:
        raise SourceError(f"{d}: no {suffix} files in this directory ({what}); is it the right one?")
    return found


def files_under(directory: Path, keep: Callable[[Path], bool]) -> list[Path]:
    """The files under `directory` that `keep` accepts (a dangling link too, so that reading it names it):
    recursive, dot-files and dot-directories left out, sorted by relative path (so the order is the same
    on every machine). Every source that takes a directory reads it this way."""
    found = (f for f in directory.rglob("*")
             if not f.is_dir() and not any(part.startswith(".") for part in f.relative_to(directory).parts) and keep(f))
    return sorted(found, key=lambda f: f.relative_to(directory).as_posix())


def read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise SourceError(f"{path}: cannot read this file ({e.strerror or e}); check that it exists "
                          "and is readable") from e


def decode_utf8(data: bytes, path: Path, record: str | None = None) -> str:
    """Strict UTF-8 with the failing byte offset and line in the error."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise invalid_utf8_error(path, e.start, line=data.count(b"\n", 0, e.start) + 1,
                                 record=record, reason=e.reason) from e


def invalid_utf8_error(path: Path | str, offset: int, *, line: int | None = None,
                       record: str | None = None, reason: str = "invalid byte") -> SourceError:
    where = f"byte {offset}" + (f", line {line}" if line is not None else "")
    rec = f" ({record})" if record else ""
    return SourceError(f"{path}: invalid UTF-8 at {where}{rec}: {reason}; {encoding_hint(path, offset)}")


def encoding_hint(path: Path | str, offset: int) -> str:
    """What the bytes at `offset` look like and how to re-encode: 0x80-0x9f are printable only in cp1252
    (latin-1 has control codes there), 0xa0-0xff read the same in both."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            bad = f.read(4)
    except OSError:
        bad = b""
    if not bad:
        return "re-encode the file as UTF-8"
    shown = " ".join(f"0x{b:02x}" for b in bad[:4])
    first = bad[0]
    if 0x80 <= first <= 0x9F:
        char = bad[:1].decode("cp1252", errors="replace")
        return (f"the bytes are {shown}; 0x{first:02x} is {char!r} in cp1252 (Windows-1252) and a control code in "
                "latin-1, so the file is most likely cp1252: `iconv -f cp1252 -t utf-8`")
    if first >= 0xA0:
        char = bad[:1].decode("latin-1")
        return (f"the bytes are {shown}; 0x{first:02x} is {char!r} in both cp1252 and latin-1 (ISO-8859-1): "
                "re-encode with `iconv -f cp1252 -t utf-8` (or -f latin1; they agree on this byte)")
    return f"the bytes are {shown}; re-encode the file as UTF-8"


def first_invalid_utf8(path: Path) -> tuple[int, int] | None:
    """(byte offset, line) of the first invalid UTF-8 byte of a file, or None. Reads in 1 MiB chunks."""
    base, line, carry = 0, 1, b""  # carry: an incomplete sequence cut by the chunk boundary
    with open(path, "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            data = carry + chunk
            try:
                data.decode("utf-8")
                good = len(data)
            except UnicodeDecodeError as e:
                if chunk and e.end == len(data) and e.reason == "unexpected end of data":
                    good = e.start
                else:
                    return base + e.start, line + data.count(b"\n", 0, e.start)
            if not chunk:
                return None
            line += data.count(b"\n", 0, good)
            base += good
            carry = data[good:]


def normalise_text(text: str) -> str:
    """The light normalisation every file source applies: drop a leading BOM, CRLF/CR -> LF."""
    if text.startswith("\ufeff"):
        text = text[1:]
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def read_text_file(path: Path) -> str:
    return normalise_text(decode_utf8(read_bytes(path), path))


# ---------------------------------------------------------------------------------------------
# Seeded split by file list


def val_count(n: int, val_frac: float) -> int:
    """Files that go to val: round-half-up(val_frac * n), at least 1 when n >= 2, never all of them."""
    if n < 2 or val_frac == 0:
        return 0
    return min(n - 1, max(1, int(val_frac * n + 0.5)))


def check_val_frac(val_frac: float, what: str) -> None:
    if not 0 <= val_frac < 1:
        raise ConfigError(f"{what}: val_frac={val_frac} is outside [0, 1); use e.g. 0.1")


def split_by_file(names: Sequence[str], val_frac: float, seed: int) -> dict[str, list[int]]:
    """Indices into the sorted `names` for train and val.

    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)); the first
    val_count(n, val_frac) entries of perm are val. Both lists come back in sorted-name order,
    so a document's split depends only on (sorted names, val_frac, seed).
    """
    import torch

    n = len(names)
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n, generator=g).tolist()
    val = sorted(perm[: val_count(n, val_frac)])
    val_set = set(val)
    return {"train": [i for i in range(n) if i not in val_set], "val": val}


FILE_SPLIT_RULE = ("by file: perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)) over "
                   "the sorted relative file names; the first round-half-up(val_frac*n) entries of perm "
                   "(at least 1 when n >= 2, never all) are val; each split is read in sorted-name order")


# ---------------------------------------------------------------------------------------------
# `datasets` rows


def builder_for(path: Path, what: str) -> str:
    b = BUILDERS.get(path.suffix.lower())
    if b is None:
        raise ConfigError(f"{path}: unsupported file type {path.suffix!r} for {what}; use one of "
                          f"{sorted(BUILDERS)}")
    return b


def builder_for_all(paths: Sequence[Path], what: str) -> str:
    kinds = {builder_for(p, what) for p in paths}
    if len(kinds) != 1:
        raise ConfigError(f"{what}: data_files mix file types ({sorted(kinds)}); pass files of one type")
    return kinds.pop()


def open_stream(path_or_id: str, what: str, *, streaming: bool = True, **kwargs: Any):
    """datasets.load_dataset(...) with failures turned into SourceError naming what was opened."""
    from datasets import load_dataset

    try:
        return load_dataset(path_or_id, streaming=streaming, **kwargs)
    except Exception as e:  # the hub, fsspec and pyarrow raise many kinds; the message is what helps
        local = [Path(f) for f in _as_list(kwargs.get("data_files"))]
        if local:  # local files: the network and the dataset id have nothing to do with it
            _raise_local_file_problem(local, what, e)
            raise SourceError(f"{what}: cannot read {[str(p) for p in local]}: {type(e).__name__}: {e}; check "
                              "that the files are valid and of the expected schema") from e
        raise SourceError(f"{what}: cannot open {path_or_id!r} ({_kwargs_text(kwargs)}): "
                          f"{type(e).__name__}: {e}; check the dataset id/config and network, or pass "
                          "local data_files") from e


def _as_list(value) -> list:
    if value is None:
        return []
    if isinstance(value, (str, os.PathLike)):
        return [value]
    if isinstance(value, dict):
        return [f for v in value.values() for f in _as_list(v)]
    return list(value)


def _raise_local_file_problem(files: Sequence[Path], what: str, cause: BaseException) -> None:
    """Name the file and line behind a `datasets` read failure, when our own reading can find it.

    `datasets` reads JSON Lines in blocks and reports a block's row (or nothing), so a bad line 2 used to
    surface as "record 0". Empty files are named as such, not blamed on a network.
    """
    for p in files:
        if not p.is_file():
            continue
        if p.stat().st_size == 0:
            raise SourceError(f"{p}: the file is empty ({what}); remove it from the inputs or fill it") from cause
        if p.suffix.lower() in (".jsonl", ".json"):
            rows = 0
            for _ in iter_jsonl(p):  # raises a SourceError naming the line, when a line is bad
                rows += 1
            if rows == 0:
                raise SourceError(f"{p}: no records (only blank lines) ({what}); remove it from the inputs "
                                  "or fill it") from cause


def iter_rows(ds, what: str, files: Sequence[Path] = ()) -> Iterator[tuple[int, dict]]:
    """(record index, row) from a datasets stream, read errors turned into SourceError.

    For a UTF-8 error the files are scanned to name the file and byte offset exactly.
    """
    it = iter(ds)
    i = 0
    while True:
        try:
            row = next(it)
        except StopIteration:
            return
        except UnicodeDecodeError as e:
            for p in files:
                if p.suffix.lower() in TEXT_SUFFIXES:
                    bad = first_invalid_utf8(p)
                    if bad is not None:
                        raise invalid_utf8_error(p, bad[0], line=bad[1], record=f"near record {i}",
                                                 reason=e.reason) from e
            raise SourceError(f"{what}: invalid UTF-8 near record {i}: {e}; re-encode the input as "
                              "UTF-8") from e
        except SourceError:
            raise
        except Exception as e:
            _raise_local_file_problem(files, what, e)
            raise SourceError(f"{what}: could not read past record {i}: {type(e).__name__}: {e}; "
                              "check that the file is valid and of the expected schema") from e
        yield i, row
        i += 1


def iter_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, record) of a JSON Lines file, read line by line; blank lines are passed over.

    Errors name the file and line: invalid UTF-8 (with its byte offset), malformed JSON, a line that
    is not a JSON object, and strings holding a lone surrogate escape (JSON allows them, UTF-8 cannot
    encode them).
    """
    import json

    try:
        f = open(path, "rb")
    except OSError as e:
        raise SourceError(f"{path}: cannot read this file ({e.strerror or e}); check that it exists "
                          "and is readable") from e
    with f:
        offset = 0
        for n, raw in enumerate(f, 1):
            start, offset = offset, offset + len(raw)
            if not raw.strip():
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise invalid_utf8_error(path, start + e.start, line=n, reason=e.reason) from e
            try:
                record = json.loads(line)
            except ValueError as e:
                raise SourceError(f"{path}, line {n}: not valid JSON ({e}); fix or remove this line") from e
            if not isinstance(record, dict):
                raise SourceError(f"{path}, line {n}: a JSON {type(record).__name__}, not an object; "
                                  "each line must be one {...} record")
            try:
                line.encode("utf-8")
                json.dumps(record, ensure_ascii=False).encode("utf-8")
            except UnicodeEncodeError as e:
                raise SourceError(f"{path}, line {n}: a lone surrogate escape ({e.object[e.start:e.end]!r}) "
                                  "that no UTF-8 text can hold; fix the escape in this record") from e
            yield n, record


def _kwargs_text(kwargs: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items() if v is not None) or "no options"


def rel_files(paths: Sequence[Path]) -> list[str]:
    return [str(p) for p in paths]


def portable(path: str | os.PathLike) -> str:
    """A path for describe(): files of the bundled sample become "sample:<relative path>"."""
    try:
        return SAMPLE_PREFIX + Path(path).resolve().relative_to(SAMPLE_DIR).as_posix()
    except ValueError:
        return str(path)


def check_field(row: dict, field: str, record: str) -> Any:
    if field not in row:
        raise SourceError(f"{record}: no {field!r} field (fields: {sorted(row)}); pass the right "
                          "field name (text_field=...) or fix the file")
    return row[field]


def user(content: str) -> Message:
    return {"role": "user", "content": content}


def assistant(content: str) -> Message:
    return {"role": "assistant", "content": content}
