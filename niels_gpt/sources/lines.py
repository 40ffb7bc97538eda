"""JSON Lines, the one way: byte ranges of a plain file, or whole files (gzip, zstd, at a URL), line by line.

- A leading UTF-8 BOM is dropped; blank lines are no records; each line is strict UTF-8 and one JSON object,
  anything else is a `BadRecord` naming the file and line (counted from the file's start only when needed).
- A compressed file that ends early is an error naming it (zstd frames are decoded one by one here, since
  zstandard's stream reader stops silently at a cut frame).
- msgspec parses a line where installed; a line it refuses is parsed again by `json`, whose record or error
  stands, so the records are what `json` gives.
- `file_sha256` is hashed from the bytes the ranges read when one process reads a file's ranges in order; a
  task's receipt digests (`range_digests`) from the bytes of each range it read.
Cost: a byte range is read in one call (task_bytes of memory); figures in docs/performance.md.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import json
import os
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

from niels_gpt.errors import SourceError
from niels_gpt.meta import receipt_digest, sha256_file
from niels_gpt.sources.text_io import BadRecord, bytes_hint

BOM = b"\xef\xbb\xbf"
_SPACE = frozenset(b" \t\n\r\x0b\x0c")  # what bytes.isspace counts as whitespace
READ_BLOCK = 1 << 20
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"  # every zstd frame opens with these four bytes
GZIP_MAGIC = b"\x1f\x8b"

try:  # NOTE: msgspec is small (a few ms to import), so not deferred to first use
    from msgspec.json import Decoder as _Decoder
    _fast_loads = _Decoder().decode
except ImportError:
    _fast_loads = None


def _zstd_blocks(raw) -> Iterator[bytes]:
    """Decompressed blocks of a zstd file of one or more frames; an error when the last frame is cut short."""
    try:
        import zstandard
    except ImportError as exc:
        raise SourceError("reading .zst needs the `zstandard` package: pip install 'niels_gpt[corpus]'") from exc
    dctx = zstandard.ZstdDecompressor()
    dobj, fed = dctx.decompressobj(), False
    chunk = raw.read(READ_BLOCK)
    if chunk and not chunk.startswith(ZSTD_MAGIC[:len(chunk)]):
        raise NotCompressed("zstd", chunk)
    while chunk:
        while chunk:
            try:
                out = dobj.decompress(chunk)
            except zstandard.ZstdError as e:
                raise EOFError(f"damaged zstd data: {e}") from e
            fed = True
            if out:
                yield out
            chunk = dobj.unused_data if dobj.eof else b""
            if dobj.eof:
                dobj, fed = dctx.decompressobj(), False
        chunk = raw.read(READ_BLOCK)
    if fed:
        raise EOFError("the last zstd frame ends before its end mark")


class NotCompressed(ValueError):
    """A file named as compressed (.gz, .zst) whose first bytes are not that format's magic number."""

    def __init__(self, codec: str, head: bytes):
        super().__init__(codec)
        self.codec, self.head = codec, head


def _looks_like_text(head: bytes) -> bool:
    try:
        head[:256].decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start > 250  # cut inside a character at the end of the sample
    return True


def _lines_of(piece, open_binary) -> Iterator[bytes]:
    """Raw lines of a whole JSON Lines file (compressed or not, local or at a URL)."""
    name = piece.item.lower()
    with open_binary(piece) as raw:
        if name.endswith(".gz"):
            import gzip

            head = raw.peek(256)[:256]  # a buffered reader, local or remote (records._open_binary)
            if head[:2] != GZIP_MAGIC[:len(head[:2])]:
                raise NotCompressed("gzip", head)
            yield from gzip.GzipFile(fileobj=raw)
        elif name.endswith(".zst"):
            tail = b""
            for block in _zstd_blocks(raw):
                block = tail + block
                *lines, tail = block.split(b"\n")
                for line in lines:
                    yield line + b"\n"
            if tail:
                yield tail
        else:
            yield from raw


_HASHED: dict[str, tuple[tuple, str]] = {}  # path -> (its _key, "sha256:<hex>")
_RUNNING: dict[str, tuple[int, Any, tuple]] = {}  # path -> (bytes hashed from its start, sha256, _key)
_MAKING: dict[str, threading.Event] = {}  # path -> set once the digest being made of it is made (or not)
_LOCK = threading.Lock()
_READ = threading.local()  # .digests: while a task reads, {(path, start, stop): receipt_digest} of its ranges


@contextlib.contextmanager
def range_digests() -> Iterator[dict]:
    """Within: each byte range read to its end on this thread is hashed once, as read, into the dict yielded
    (a task's receipt digests), instead of into its file's running sha256 (the driver hashes whole files)."""
    _READ.digests = found = {}
    try:
        yield found
    finally:
        _READ.digests = None


def _key(st: os.stat_result) -> tuple:
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev


def _hash_read(path: str, start: int, data: bytes, st: os.stat_result) -> None:
    """Extend `path`'s running sha256 by a range read at `start` if it follows what was hashed (ranges read out
    of order stop it); at the file's end the digest is kept for `file_sha256`."""
    with _LOCK:
        done, h, was = _RUNNING.pop(path, None) or (0, None, None)
        if start == 0:
            done, h, was = 0, hashlib.sha256(), _key(st)
        if h is None or done != start or was != _key(st):
            return
        h.update(data)
        if start + len(data) >= st.st_size:
            _HASHED[path] = (was, "sha256:" + h.hexdigest())
        else:
            _RUNNING[path] = (start + len(data), h, was)


def file_sha256(path: str, stop: threading.Event | None = None) -> str | None:
    """"sha256:<hex>" of a local file: as hashed earlier in this process if unchanged since (size, mtime, ctime,
    inode), else read and hashed now; None if `stop` is set meanwhile. A second caller waits for the digest being
    made instead of making it again; the lock is not held while hashing (a reader's `_hash_read` goes on), and a
    file changed while hashed is not kept."""
    while True:
        with _LOCK:
            key = _key(os.stat(path))
            if _HASHED.get(path, (None,))[0] == key:
                return _HASHED[path][1]
            making = _MAKING.get(path)
            if making is None:
                _MAKING[path] = mine = threading.Event()
                break
        making.wait()  # then its digest, or (it stopped, the file changed) made here
    try:
        if (digest := sha256_file(path, stop)) is None:
            return None
        with _LOCK:
            if _key(os.stat(path)) == key:
                _HASHED[path] = (key, "sha256:" + digest)
        return "sha256:" + digest
    finally:
        with _LOCK:
            _MAKING.pop(path, None)
        mine.set()


def hash_ahead(paths: list[str], stop: threading.Event) -> None:
    """`file_sha256` of each local file, on a build's helper thread while it reads them (or its workers do), so its
    input table finds them made; `stop` set: the build ended."""
    for path in paths:
        if stop.is_set():
            return
        with contextlib.suppress(OSError):  # file_sha256 meets the error again and the build names it
            file_sha256(path, stop)


def _new_lock() -> None:
    global _LOCK
    _LOCK = threading.Lock()
    _MAKING.clear()  # digests a thread of the parent was making: none is made here


if hasattr(os, "register_at_fork"):  # a process forked while a file was hashed gets a lock no thread holds
    os.register_at_fork(after_in_child=_new_lock)


def _range_records(piece) -> Iterator[tuple[Any, Any]]:
    """(where, record or BadRecord) per non-blank line of a byte range of a plain file: a build's hot loop, kept
    to one view, one blank test and one parse a line (bench/bench_parse.py)."""
    with open(piece.item, "rb") as f:
        f.seek(piece.start)
        data = f.read(piece.stop - piece.start)
        st = os.fstat(f.fileno())
    item, find, size, view = piece.item, data.find, len(data), memoryview(data)
    pos = len(BOM) if piece.start == 0 and data.startswith(BOM) else 0
    start, k = 0, 0  # the offset of a line counts its BOM, as a line's byte numbers in errors always have
    while pos < size:
        end = find(b"\n", pos)
        end = size if end < 0 else end + 1
        # blank: all whitespace (what `not line.strip()` tests); a line's bytes are a view, not a copy
        if data[pos] not in _SPACE or not data[pos:end].isspace():
            raw = view[pos:end]
            where = _Where(item, piece.start, k)
            where.offset = piece.start + start  # the line's byte offset in the file: a document's origin
            yield where, _parse(raw, where, where.offset)
        start, pos, k = end, end, k + 1
    found = getattr(_READ, "digests", None)  # a range read to its end (planning reads one record)
    if found is None:
        _hash_read(piece.item, piece.start, data, st)
    else:
        found[piece.item, piece.start, piece.stop] = receipt_digest(data)


@functools.lru_cache(maxsize=64)
def _line_at(path: str, start: int, key: tuple) -> int:
    """The number of the line that byte `start` of `path` (as of its `_key`) begins: counted when an error needs it."""
    n = 1
    with open(path, "rb") as f:
        while start > 0 and (chunk := f.read(min(start, 1 << 24))):
            n += chunk.count(b"\n")
            start -= len(chunk)
    return n


class _Where:
    """`<file>, line N`, formatted only if used. `start`: of the byte range the line is in (None: a whole file)."""

    __slots__ = ("item", "start", "k", "offset")

    def __init__(self, item: str, start: int | None, k: int):
        self.item, self.start, self.k = item, start, k

    def __str__(self) -> str:
        n = self.k + (_line_at(self.item, self.start, _key(os.stat(self.item))) if self.start is not None else 1)
        return f"{self.item}, line {n}"


def opens_a_document(first_line: bytes) -> bool:
    """Whether a `.json` file's first non-blank line opens one JSON document: `[...`, or a `{` left open at the
    line's end (`{`, `{"data": [`, `{"version": 2,`), where a record of JSON Lines closes its `}`."""
    first = first_line.removeprefix(BOM).strip()
    return first.startswith(b"[") or first.startswith(b"{") and first.endswith((b"{", b"[", b",", b":"))


def document_records(item: str, data: bytes) -> Iterator[tuple[str, Any]]:
    """The records of a `.json` file holding one document: an array of records, an object holding one array of
    records (`{"data": [...]}`), or else that object as one record. Read whole."""
    try:
        text = data.removeprefix(BOM).decode("utf-8")
        doc = json.loads(text)
    except UnicodeDecodeError as e:
        raise SourceError(f"{item}: not UTF-8 ({e.reason} at byte {e.start}); re-encode the file as UTF-8") from None
    except ValueError as e:
        raise SourceError(f"{item}: opens a JSON document (an array or a pretty-printed object) that is not valid "
                          f"JSON ({e}); fix the file, or write one record per line (JSON Lines)") from None
    if isinstance(doc, dict):
        arrays = [k for k, v in doc.items() if isinstance(v, list) and v and all(isinstance(r, dict) for r in v)]
        if len(arrays) == 1 and arrays[0] not in ("messages", "conversations"):
            doc = doc[arrays[0]]
        else:
            yield f"{item}, record 1", doc
            return
    if not isinstance(doc, list):
        raise SourceError(f"{item}: holds a JSON {type(doc).__name__}, not records; give an array of {{...}} "
                          "records, or one record per line (JSON Lines)")
    escapes = "\\ud" in text or "\\uD" in text  # a lone surrogate can only come from an escape
    for i, record in enumerate(doc, 1):
        where = f"{item}, record {i}"
        if isinstance(record, dict):
            yield where, _lone_surrogate(record, where) if escapes else record
        else:
            yield where, BadRecord("not_an_object", f"{where}: a JSON {type(record).__name__}, not an object; each "
                                   "element of the array must be one {...} record")


def json_lines(piece, open_binary) -> Iterator[tuple[Any, Any]]:
    """(where, record or BadRecord) per non-blank line of a JSON Lines piece (a byte range, or a whole file
    opened with `open_binary`); a whole `.json` file that opens a document is read as its records."""
    ranged = piece.stop >= 0 and "://" not in piece.item and piece.kind in (".jsonl", ".json")
    with _decompressing(piece.item, "plain JSON Lines"):
        if ranged:
            yield from _range_records(piece)
            return
        lines = _lines_of(piece, open_binary)
        if piece.item.lower().endswith((".json", ".json.gz", ".json.zst")):  # JSON Lines, or one JSON document
            head: list[bytes] = []
            for raw in lines:
                head.append(raw)
                if raw.strip():
                    break
            if head and opens_a_document(head[-1]):
                yield from document_records(piece.item, b"".join(head) + b"".join(lines))
                return
            lines = itertools.chain(head, lines)
        offset = 0
        for k, raw in enumerate(lines):
            start = offset
            offset += len(raw)
            if k == 0 and raw.startswith(BOM):
                raw = raw[len(BOM):]
            if not raw.strip():
                continue
            where = _Where(piece.item, None, k)
            where.offset = start  # the line's byte offset in the (decompressed) file: a document's origin
            yield where, _parse(raw, where, None)


def decompressed(piece, open_binary) -> bytes:
    """The whole decompressed contents of a `.gz` / `.zst` file (a compressed text file), errors as json_lines'."""
    with _decompressing(piece.item, "plain text"):
        return b"".join(_lines_of(piece, open_binary))


def first_line(path) -> bytes:
    """The first non-blank line of a local JSON Lines file, compressed (`.gz`, `.zst`) or not; b"" when none."""
    with contextlib.closing(_lines_of(SimpleNamespace(item=str(path)), lambda p: open(p.item, "rb"))) as lines:
        return next((line for line in lines if line.strip()), b"")


@contextlib.contextmanager
def _decompressing(item: str, kind: str):
    try:
        yield
    except NotCompressed as e:
        suffix = ".zst" if e.codec == "zstd" else ".gz"
        what = "plain text" if _looks_like_text(e.head) else "some other data"
        raise SourceError(f"{item}: named {suffix} but not {e.codec} data (it holds {what}, without the {e.codec} "
                          f"magic bytes); rename it without {suffix} if it is {kind}, or compress it with "
                          f"{e.codec}") from None
    except (OSError, EOFError) as e:  # a truncated or damaged .gz / .zst
        raise SourceError(f"{item}: cannot decompress ({e}); the file is truncated or damaged: "
                          "recompress it or remove it from the inputs") from e


def _parse(raw: bytes | memoryview, where, offset: int | None) -> dict | BadRecord:
    if _fast_loads is not None:
        try:
            record = _fast_loads(raw)
        except (ValueError, RecursionError):  # msgspec's errors, bad UTF-8 included, are ValueErrors
            pass  # json decides: it accepts what msgspec refuses (NaN, lone surrogates), or names the error
        else:
            if type(record) is dict:
                return record  # msgspec refuses lone surrogate escapes, so no check for them is needed
    raw = bytes(raw)
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        at = f" (byte {offset + e.start} of the file)" if offset is not None else ""
        return BadRecord("invalid_utf8", f"{where}: not UTF-8 ({e.reason} at byte {e.start} of the line{at}); "
                         + bytes_hint(raw[e.start:e.start + 4]))
    try:
        record = json.loads(line)
    except ValueError as e:
        return BadRecord("invalid_json", f"{where}: not valid JSON ({e}); fix or remove this line")
    if not isinstance(record, dict):
        return BadRecord("not_an_object", f"{where}: a JSON {type(record).__name__}, not an object; each line "
                         "must be one {...} record")
    if "\\ud" in line or "\\uD" in line:  # JSON may escape a lone surrogate, which no UTF-8 text can hold
        return _lone_surrogate(record, where)
    return record


def _lone_surrogate(record: dict, where) -> dict | BadRecord:
    """The record, or a BadRecord if a string in it holds a lone surrogate (from a `\\udXXX` escape)."""
    try:
        json.dumps(record, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        return BadRecord("invalid_text", f"{where}: a lone surrogate escape ({e.object[e.start:e.end]!r}) that "
                         "no UTF-8 text can hold; fix the escape in this record")
    return record
