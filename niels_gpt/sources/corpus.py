"""A user's own corpus: any mix of local files, directories, globs, URLs and Hugging Face dataset ids.

    src = corpus(["data/", "extra/*.jsonl.zst", "notes.md", "s3://bucket/more/*.parquet"], text_field="text")
    src.iter_texts()                      # documents, in the order of the sources as given
    chats = corpus(["sft.jsonl"]).iter_conversations()

- Files: `.txt`/`.md`/`.raw` are one document each (BOM dropped, CRLF -> LF); `.jsonl`/`.json`
  (`.gz`, `.zst` compressed too) one record per line; `.parquet`, `.csv` and `.arrow` (an Arrow IPC
  file or stream, as `datasets` saves them) one record per row. A directory stands for its files of
  those kinds (recursively, sorted by relative path, dot-files out); a glob for its matches, sorted.
- A URL (`s3://`, `gs://`, `hf://`, `http(s)://`, `memory://`, `file://`; niels_gpt.storage.fs) is read
  through fsspec: a file URL is one file as above; on a scheme that can list (not http) a prefix stands
  for its files like a directory, a URL with `*?[` for its matches like a glob (names starting with a dot
  left out), in the same sorted order as local paths. Line and CSV files are streamed; Parquet and Arrow
  files are downloaded into the local download cache (niels_gpt.storage) while they are read. The same
  bytes give the same documents as a local copy, and errors name the URL. `file://` is a local path.
- Anything else that does not exist locally and looks like `owner/name` is a Hugging Face dataset,
  streamed (`load_dataset(id, name=hf_config, split=split, streaming=True)`).
- Text: the record's `text_field`. Chat (`chat=True`): the record's `messages_field`, a list of
  `{"role", "content"}`, or with `chat_columns=("instruction", "response")` one user turn and one
  assistant turn from those columns.
- A bad record (not JSON, the field missing or not text, messages of the wrong shape) is an error naming
  the file and line (record number for columnar files); with `on_bad_record="skip"` it is skipped and
  counted by reason, and the counts reach meta.json. Empty documents and null text are always skipped
  and counted.
- Nothing is materialised: one file (one Parquet/Arrow batch) is read at a time.
"""

from __future__ import annotations

import contextlib
import glob as globlib
import hashlib
import io
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from niels_gpt.errors import ConfigError, SourceError
from niels_gpt.sources.base import (
    ChatSource,
    TextSource,
    decode_utf8,
    files_under,
    iter_rows,
    normalise_text,
    open_stream,
    portable,
    read_text_file,
)
from niels_gpt.storage.fs import filesystem, scheme_of, with_retries
from niels_gpt.storage.remote import MIRRORS, local_cache_dir
from niels_gpt.storage.upload import local_path_of
from niels_gpt.urls import is_url

TEXT_FIELD = "text"
MESSAGES_FIELD = "messages"
ON_BAD_RECORD = ("error", "skip")
WHOLE_FILE = (".txt", ".md", ".raw")
LINES = (".jsonl", ".json", ".jsonl.gz", ".json.gz", ".jsonl.zst", ".json.zst")
COLUMNAR = (".parquet", ".csv", ".arrow")
SUFFIXES = WHOLE_FILE + LINES + COLUMNAR
ROLES = ("system", "user", "assistant")


GLOB_CHARS = "*?["
UNLISTABLE = ("http", "https")  # fsspec's http "listing" scrapes HTML pages: refused, give file URLs


@dataclass(frozen=True)
class RemoteFile:
    """One input file at a URL (read through fsspec); `size` in bytes when the server told it."""

    url: str
    size: int | None = None

    def __str__(self) -> str:  # how errors and meta.json name it
        return self.url

    @property
    def name(self) -> str:
        return self.url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]


class BadRecord(Exception):
    """One record that cannot be used: `reason` is its count's name in meta.json."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def kind_of(path: Path | RemoteFile) -> str | None:
    name = path.name.lower()
    return next((s for s in sorted(SUFFIXES, key=len, reverse=True) if name.endswith(s)), None)


def is_hf_id(spec: str) -> bool:
    parts = spec.split("/")
    return len(parts) == 2 and all(parts) and not any(c in spec for c in GLOB_CHARS) and kind_of(Path(spec)) is None


def _sized(info: dict) -> int | None:
    size = info.get("size")
    return size if isinstance(size, int) and size >= 0 else None


def _ask(fn, url: str, what: str):
    """A storage call about `url`, retried on transient errors; a missing or forbidden object is a SourceError."""
    try:
        return with_retries(fn, f"{what} {url}")
    except FileNotFoundError:
        raise SourceError(f"{url}: no such file or directory at this URL; check the URL (and the endpoint and "
                          "credentials of its storage)") from None
    except PermissionError as exc:
        raise SourceError(f"{url}: access denied ({exc}); check the credentials of its storage") from None


def expand_url(url: str) -> list[RemoteFile]:
    """The files a URL stands for: itself, a prefix's files (recursively) or a glob's matches, sorted."""
    fs, path = filesystem(url)  # an unknown scheme, or one whose backend is missing: a ConfigError naming the extra
    scheme = scheme_of(url)
    head, _, rest = url.partition("://")
    parts = rest.split("/")
    first_glob = next((k for k, part in enumerate(parts) if any(c in part for c in GLOB_CHARS)), None)
    if scheme in UNLISTABLE:
        first_glob = None  # "?" starts a query string, not a pattern
    if first_glob is not None:
        base_url = f"{head}://" + "/".join(parts[:first_glob])
        base = fs._strip_protocol(base_url).rstrip("/")
        matches = _ask(lambda: fs.glob(path, detail=True), url, "listing")
        found = []
        for p, info in matches.items():
            rel = p[len(base):].lstrip("/") if p.startswith(base) else p
            f = RemoteFile(f"{base_url.rstrip('/')}/{rel}", _sized(info))
            if info.get("type") != "directory" and not f.name.startswith(".") and kind_of(f):
                found.append((PurePosixPath(rel), f))
        if not found:
            raise SourceError(f"{url}: this glob matches no file of a known kind ({', '.join(SUFFIXES)})")
        return [f for _, f in sorted(found, key=lambda pf: pf[0])]
    info = _ask(lambda: fs.info(path), url, "reading")
    if info.get("type") == "directory":
        if scheme in UNLISTABLE:
            raise SourceError(f"{url}: {scheme}:// cannot list a directory; give the URL of each file")
        listed = _ask(lambda: fs.find(path, detail=True), url, "listing")
        found = []
        for p, finfo in listed.items():
            rel = PurePosixPath(p[len(path):].lstrip("/"))
            f = RemoteFile(f"{url.rstrip('/')}/{rel.as_posix()}", _sized(finfo))
            if finfo.get("type") != "directory" and kind_of(f) and not any(s.startswith(".") for s in rel.parts):
                found.append((rel.as_posix(), f))
        if not found:
            raise SourceError(f"{url}: no files of a known kind under this URL (known: {', '.join(SUFFIXES)})")
        return [f for _, f in sorted(found, key=lambda pf: pf[0])]
    f = RemoteFile(url, _sized(info))
    if kind_of(f) is None:
        raise SourceError(f"{url}: unknown file kind; known: {', '.join(SUFFIXES)}")
    return [f]


def expand(specs: Sequence[str | os.PathLike]) -> list[Path | RemoteFile | str]:
    """Local files (directories and globs expanded, sorted), files at URLs and dataset ids, in the order given."""
    out: list[Path | RemoteFile | str] = []
    for spec in specs:
        text = os.fspath(spec)
        if is_url(text):
            local = local_path_of(text)  # file:// is read as the local path it names
            if local is None:
                out.extend(expand_url(text))
                continue
            text = local
        p = Path(text)
        if p.is_dir():
            found = files_under(p, kind_of)
            if not found:
                raise SourceError(f"{p}: no files of a known kind in this directory (known: {', '.join(SUFFIXES)})")
            out.extend(found)
        elif p.is_file():
            if kind_of(p) is None:
                raise SourceError(f"{p}: unknown file kind; known: {', '.join(SUFFIXES)}")
            out.append(p)
        elif any(c in text for c in "*?["):
            found = sorted(Path(f) for f in globlib.glob(text, recursive=True) if Path(f).is_file() and kind_of(Path(f)))
            if not found:
                raise SourceError(f"{text}: this glob matches no file of a known kind ({', '.join(SUFFIXES)})")
            out.extend(found)
        elif is_hf_id(text):
            out.append(text)
        else:
            raise SourceError(f"{text}: no such file or directory, and not a Hugging Face dataset id (owner/name)")
    return out


def _open_binary(item: Path | RemoteFile):
    """A binary reader of a local file, or of a file at a URL (streamed through fsspec)."""
    if not isinstance(item, RemoteFile):
        return open(item, "rb")
    fs, path = filesystem(item.url)
    streamed = {"block_size": 0} if scheme_of(item.url) in UNLISTABLE else {}  # http: one GET, no range requests
    raw = _ask(lambda: fs.open(path, "rb", **streamed), item.url, "opening")
    return io.BufferedReader(raw, buffer_size=1 << 20)  # fsspec's readline seeks: lines come from this buffer


@contextlib.contextmanager
def _local_copy(item: Path | RemoteFile) -> Iterator[Path]:
    """A local path of the file: itself, or a download into the local download cache, deleted afterwards."""
    if not isinstance(item, RemoteFile):
        yield item
        return
    fs, path = filesystem(item.url)
    tmp = (local_cache_dir() / MIRRORS / "sources"
           / f"{hashlib.sha256(item.url.encode()).hexdigest()[:16]}-{item.name}.tmp-{os.getpid()}")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    try:
        _ask(lambda: fs.get_file(path, os.fspath(tmp)), item.url, "downloading")
        yield tmp
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _read_text(item: Path | RemoteFile) -> str:
    if not isinstance(item, RemoteFile):
        return read_text_file(item)
    with _open_binary(item) as f:
        return normalise_text(decode_utf8(f.read(), item.url))


def _open_lines(path: Path | RemoteFile):
    name = path.name.lower()
    raw = _open_binary(path)
    if name.endswith(".gz"):
        import gzip

        return gzip.GzipFile(fileobj=raw)
    if name.endswith(".zst"):
        try:
            import zstandard
        except ImportError as exc:
            raw.close()
            raise SourceError(f"{path}: reading .zst needs the `zstandard` package: pip install "
                              "'niels_gpt[corpus]'") from exc
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, closefd=True))
    return raw


def _json_lines(path: Path | RemoteFile) -> Iterator[tuple[str, Any]]:
    """(where, record or BadRecord) per non-blank line."""
    import json

    with _open_lines(path) as f:
        try:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = f"{path}, line {n}"
                try:
                    record = json.loads(line.decode("utf-8"))
                except UnicodeDecodeError as e:
                    yield where, BadRecord("invalid_utf8", f"{where}: not UTF-8 ({e.reason} at byte {e.start} of the "
                                           "line); re-encode the file as UTF-8")
                    continue
                except ValueError as e:
                    yield where, BadRecord("invalid_json", f"{where}: not valid JSON ({e}); fix or remove this line")
                    continue
                if not isinstance(record, dict):
                    yield where, BadRecord("not_an_object", f"{where}: a JSON {type(record).__name__}, not an "
                                           "object; each line must be one {...} record")
                    continue
                yield where, record
        except (OSError, EOFError) as e:  # a truncated or corrupt .gz/.zst
            raise SourceError(f"{path}: cannot decompress ({e}); the file is truncated or damaged") from e


def _rows(path: Path | RemoteFile, columns: list[str]) -> Iterator[tuple[str, Any]]:
    kind = kind_of(path)
    if kind == ".csv":
        import csv

        with io.TextIOWrapper(_open_binary(path), encoding="utf-8-sig", newline="") as f:
            reader = csv.DictReader(f)
            for row in reader:
                yield f"{path}, line {reader.line_num}", row
        return
    with _local_copy(path) as local:
        yield from _arrow_rows(path, local, kind, columns)


def _arrow_rows(path: Path | RemoteFile, local: Path, kind: str, columns: list[str]) -> Iterator[tuple[str, Any]]:
    """Rows of a Parquet or Arrow file read from `local`, named after `path`."""
    import pyarrow as pa

    try:
        if kind == ".parquet":
            import pyarrow.parquet as pq

            pf = pq.ParquetFile(local)
            present = [c for c in columns if c in pf.schema_arrow.names]
            batches = pf.iter_batches(columns=present or None)
        else:
            try:
                reader = pa.ipc.open_file(local)
                batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
            except pa.ArrowInvalid:
                batches = iter(pa.ipc.open_stream(local))
        i = 0
        for batch in batches:
            for row in batch.to_pylist():
                yield f"{path}, row {i}", row
                i += 1
    except (pa.ArrowException, OSError) as e:
        raise SourceError(f"{path}: cannot read this {kind} file ({e}); check that it is complete") from e


def _hf_rows(dataset_id: str, config: str | None, split: str) -> Iterator[tuple[str, Any]]:
    what = f"{dataset_id} (config {config}, split {split})"
    ds = open_stream(dataset_id, what, streaming=True, name=config, split=split)
    for i, row in iter_rows(ds, what):
        yield f"{dataset_id}, record {i}", row


class Corpus(TextSource, ChatSource):
    """Documents (or conversations) from a mix of local files and dataset ids."""

    name = "corpus"
    own_split = False
    streaming = True
    split_rule = "none: the sources in the order given; the builder splits"

    def __init__(self, items: list[Path | RemoteFile | str], *, text_field: str, messages_field: str,
                 chat_columns: tuple[str, str] | None, on_bad_record: str, hf_config: str | None, split: str):
        super().__init__()
        self.items = items
        self.text_field, self.messages_field, self.chat_columns = text_field, messages_field, chat_columns
        self.on_bad_record, self.hf_config, self.split = on_bad_record, hf_config, split
        self.dataset_id = next((i for i in items if isinstance(i, str)), None)
        self.dataset_config = hf_config if self.dataset_id else None

    def files(self) -> list[str]:
        return [str(i) for i in self.items if isinstance(i, (Path, RemoteFile))]

    def input_paths(self) -> list[Path]:
        return [i for i in self.items if isinstance(i, Path)]

    def input_bytes(self) -> int | None:
        """Total bytes of the input, for a progress bar's ETA: only when every item is an uncompressed text
        file of known size, local or at a URL (the bar counts the UTF-8 bytes of the documents read)."""
        if any(isinstance(i, str) or kind_of(i) not in WHOLE_FILE + (".jsonl", ".json") for i in self.items):
            return None
        sizes = [i.size if isinstance(i, RemoteFile) else i.stat().st_size for i in self.items]
        return None if any(s is None for s in sizes) else sum(sizes)

    def _records(self, columns: list[str]) -> Iterator[tuple[str, Any]]:
        for item in self.items:
            if isinstance(item, str):
                yield from _hf_rows(item, self.hf_config, self.split)
            elif kind_of(item) in WHOLE_FILE:
                yield str(item), {self.text_field: _read_text(item)}
            elif kind_of(item) in LINES:
                yield from _json_lines(item)
            else:
                yield from _rows(item, columns)

    def _bad(self, exc: BadRecord) -> None:
        if self.on_bad_record == "error":
            raise SourceError(f"{exc} (or pass --on-bad-record skip to skip and count such records)")
        self.skipped[exc.reason] += 1

    def _iter_split(self, split: str | None) -> Iterator[str]:
        for where, record in self._records([self.text_field]):
            try:
                if isinstance(record, BadRecord):
                    raise record
                text = _text(record, self.text_field, where)
            except BadRecord as exc:
                self._bad(exc)
                continue
            if text is None:
                self.skipped["null_text"] += 1
            elif not text.strip():
                self.skipped["empty_document"] += 1
            else:
                yield normalise_text(text) if "\r" in text or text.startswith("\ufeff") else text

    def iter_conversations(self) -> Iterator[list[dict]]:
        columns = list(self.chat_columns) if self.chat_columns else [self.messages_field]
        for where, record in self._records(columns):
            try:
                if isinstance(record, BadRecord):
                    raise record
                yield (_column_pair(record, self.chat_columns, where) if self.chat_columns
                       else _messages(record, self.messages_field, where))
            except BadRecord as exc:
                self._bad(exc)

    def _describe_extra(self) -> dict[str, Any]:
        return {"items": [portable(i) if isinstance(i, Path) else str(i) for i in self.items],
                "text_field": self.text_field, "messages_field": self.messages_field,
                "chat_columns": list(self.chat_columns) if self.chat_columns else None,
                "on_bad_record": self.on_bad_record, "split": self.split}


def _text(record: dict, field: str, where: str) -> str | None:
    if field not in record:
        raise BadRecord("missing_field", f"{where}: no {field!r} field (fields: {sorted(record)}); pass "
                        "--text-field NAME or fix the record")
    text = record[field]
    if text is not None and not isinstance(text, str):
        raise BadRecord("not_text", f"{where}: field {field!r} is {type(text).__name__}, not text; point "
                        "--text-field at a string field")
    return text


def _messages(record: dict, field: str, where: str) -> list[dict]:
    if field not in record:
        raise BadRecord("missing_field", f"{where}: no {field!r} field (fields: {sorted(record)}); pass "
                        "--messages-field NAME, or --chat-columns USER_COL,ASSISTANT_COL")
    msgs = record[field]
    if not isinstance(msgs, list):
        raise BadRecord("bad_messages", f"{where}: {field!r} is {type(msgs).__name__}, not a list of "
                        "{\"role\", \"content\"} messages")
    out = []
    for k, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise BadRecord("bad_messages", f"{where}: message {k} is not {{\"role\": one of {list(ROLES)}, "
                            f"\"content\": str}} (got {str(m)[:80]})")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def _column_pair(record: dict, columns: tuple[str, str], where: str) -> list[dict]:
    out = []
    for col, role in zip(columns, ("user", "assistant"), strict=True):
        value = record.get(col)
        if not isinstance(value, str):
            raise BadRecord("missing_field" if col not in record else "not_text",
                            f"{where}: column {col!r} is {'missing' if col not in record else type(value).__name__}, "
                            "not text; pass --chat-columns USER_COL,ASSISTANT_COL")
        out.append({"role": role, "content": value})
    return out


def corpus(sources: Sequence[str | os.PathLike], *, text_field: str = TEXT_FIELD,
           messages_field: str = MESSAGES_FIELD, chat_columns: Sequence[str] | None = None,
           on_bad_record: str = "error", hf_config: str | None = None, split: str = "train") -> Corpus:
    """A corpus over `sources` (files, directories, globs, URLs, dataset ids); see the module docstring."""
    if on_bad_record not in ON_BAD_RECORD:
        raise ConfigError(f"on_bad_record must be one of {ON_BAD_RECORD}, got {on_bad_record!r}")
    if chat_columns is not None and len(chat_columns) != 2:
        raise ConfigError(f"chat_columns must name two columns (user, assistant), got {list(chat_columns)}")
    if not sources:
        raise ConfigError("no sources given: pass files, directories, globs, URLs or dataset ids")
    return Corpus(expand(sources), text_field=text_field, messages_field=messages_field,
                  chat_columns=tuple(chat_columns) if chat_columns else None, on_bad_record=on_bad_record,
                  hf_config=hf_config, split=split)
