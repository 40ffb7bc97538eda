"""What every format module shares: token dtypes, a file's token payload, and the document stream.

A *token file* is a path plus (dtype, byte offset, token count): enough to map its payload behind any header.
A *document stream* is how `convert` moves a corpus between formats: `(content, ends_document)` pieces whose
content is one document's tokens *without* its framing token (the EOT that ends a document, or the BOS that
starts one in BOS-prefixed nanoGPT shards); each writer adds its own framing back.

    EOS-framed   d1 d1 E d2 E        ->  (d1 d1, True) (d2, True)
    BOS-framed   B d1 d1 B d2        ->  (d1 d1, True) (d2, True)

Cost: one Python step per document and a vectorised scan per block of BLOCK_TOKENS; memory is one block.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from niels_gpt.constants import PEER_TOKEN_DTYPES
from niels_gpt.errors import ConfigError, FormatError, TokenRangeError

BLOCK_TOKENS = 1 << 22  # tokens per read block when streaming (8 MiB of uint16)
_ALIASES = {"uint16": "uint16", "uint16-le": "uint16", "u2": "uint16", "<u2": "uint16",
            "uint32": "uint32", "uint32-le": "uint32", "u4": "uint32", "<u4": "uint32"}

Piece = tuple[np.ndarray, bool]


def parse_dtype(value) -> np.dtype:
    """'uint16' | 'uint16-le' | '<u2' | np.dtype -> little-endian uint16/uint32 dtype."""
    if isinstance(value, np.dtype) or isinstance(value, type):
        dt = np.dtype(value)
        if dt.kind == "u" and dt.itemsize in (2, 4):
            return dt.newbyteorder("<")
        raise ConfigError(f"token dtype {dt} is not supported; use uint16 or uint32")
    name = _ALIASES.get(str(value).lower())
    if name is None:
        raise ConfigError(f"token dtype {value!r} is not supported; use uint16 or uint32")
    return PEER_TOKEN_DTYPES[name]


def dtype_name(dtype: np.dtype) -> str:
    return {2: "uint16", 4: "uint32"}[np.dtype(dtype).itemsize]


@dataclass(frozen=True)
class TokenFile:
    """The token payload of one file: `count` tokens of `dtype` starting at byte `offset`."""

    path: str
    dtype: np.dtype
    offset: int
    count: int

    def open(self) -> np.ndarray:
        """Read-only memmap of the payload (an empty array when there are no tokens)."""
        if self.count == 0:
            return np.empty(0, dtype=self.dtype)
        return np.memmap(self.path, dtype=self.dtype, mode="r", offset=self.offset, shape=(self.count,))


def check_payload_size(path: str | os.PathLike, offset: int, count: int, itemsize: int, what: str) -> None:
    """The file must hold exactly `offset + count * itemsize` bytes; say which way it is wrong."""
    size = os.path.getsize(path)
    want = offset + count * itemsize
    if size < want:
        raise FormatError(f"{path}: truncated: {what} promises {count} tokens ({want} bytes) but the file "
                          f"has {size} bytes; re-copy or re-convert the file")
    if size > want:
        raise FormatError(f"{path}: {size - want} bytes beyond the {count} tokens that {what} declares "
                          "(the header lies or the file was appended to); re-convert the file")


def check_fits(ids: np.ndarray, dtype: np.dtype, where: str,
               fix: str = "write uint32 (--dtype uint32) or check the tokenizer") -> None:
    """Refuse ids that do not fit `dtype` before any cast (numpy's astype wraps silently)."""
    if ids.size == 0:
        return
    lo, hi = int(ids.min()), int(ids.max())
    info = np.iinfo(dtype)
    if lo < info.min or hi > info.max:
        bad = hi if hi > info.max else lo
        raise TokenRangeError(f"{where}: token id {bad} does not fit {np.dtype(dtype).name} (max {info.max}); {fix}")


def check_ids(dtype: np.dtype, **ids: int | None) -> None:
    """Refuse a framing id given (eot_id=, bos_id=: --eot-id, --bos-id) that no token of `dtype` holds: it would
    match no token, and every document boundary would be lost without a word."""
    for name, v in ((k, v) for k, v in ids.items() if v is not None):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= np.iinfo(dtype).max:
            raise ConfigError(f"--{name.replace('_', '-')} {v!r}: not a token id of these {np.dtype(dtype).name} "
                              f"tokens (0..{np.iinfo(dtype).max}); give the id of the token that frames every document")


def iter_blocks(files: Iterable[TokenFile], block: int = BLOCK_TOKENS) -> Iterator[np.ndarray]:
    """The concatenated payloads of `files`, in blocks of at most `block` tokens: views of each opened payload,
    not copies (a copy would double the cost of a scan)."""
    for tf in files:
        arr = tf.open()
        for start in range(0, len(arr), block):
            yield np.asarray(arr[start:start + block])
        del arr


def split_eos(blocks: Iterable[np.ndarray], eos: int) -> Iterator[Piece]:
    """Pieces of an EOS-terminated stream. A tail after the last EOS comes out with ends=False."""
    for blk in blocks:
        prev = 0
        for p in np.flatnonzero(blk == eos).tolist():
            yield blk[prev:p], True
            prev = p + 1
        if prev < len(blk):
            yield blk[prev:], False


def split_bos(blocks: Iterable[np.ndarray], bos: int, *, close_at_end: bool = True) -> Iterator[Piece]:
    """Pieces of a BOS-prefixed stream; tokens before the first BOS are a document of their own. The last
    document ends with the stream unless `close_at_end` is False (metadata.yaml's `last_document_open`)."""
    started = False  # inside a document: after a BOS, or content seen before any BOS
    for blk in blocks:
        prev = 0
        for p in np.flatnonzero(blk == bos).tolist():
            if started or p > prev:
                yield blk[prev:p], True
            started = True
            prev = p + 1
        if prev < len(blk):
            yield blk[prev:], False
            started = True
    if started and close_at_end:
        yield np.empty(0, dtype=np.uint32), True


@dataclass
class DocStream:
    """A corpus on its way between formats: its pieces, their dtype and framing ids, and where they come from
    (the rest that is known about the tokens stays on the source's FormatInfo)."""

    pieces: Iterator[Piece]
    dtype: np.dtype
    eot_id: int | None = None
    bos_id: int | None = None
    source: dict = field(default_factory=dict)


class Framer:
    """Turns pieces back into a token stream with one framing: suffix `eos` or prefix `bos` (exactly one).
    `opened` says whether the stream ended inside an unterminated document."""

    def __init__(self, *, eos: int | None = None, bos: int | None = None, dtype: np.dtype):
        self.eos, self.bos, self.dtype = eos, bos, np.dtype(dtype)
        self.opened = False  # a document has started and not ended
        self.documents = 0

    def frame(self, content: np.ndarray, ends: bool) -> list[np.ndarray]:
        out = []
        if self.bos is not None and not self.opened:
            out.append(np.array([self.bos], dtype=self.dtype))
        self.opened = True
        if len(content):
            out.append(content)
        if ends:
            if self.eos is not None:
                out.append(np.array([self.eos], dtype=self.dtype))
            self.opened = False
            self.documents += 1
        return out


class RollingWriter:
    """Writes one token stream into files of at most `max_tokens` tokens, `open_file(index)` making each sink
    (write, close -> record, abort) only when a token arrives for it: no empty file. Each record gets the
    file's "tokens"."""

    def __init__(self, open_file, max_tokens: int):
        self._open_file, self.max_tokens = open_file, max_tokens
        self._sink, self._in_file, self._index = None, 0, 0
        self.records: list[dict] = []
        self.tokens = 0

    def write(self, arr: np.ndarray) -> None:
        while len(arr):
            if self._sink is None:
                self._sink = self._open_file(self._index)
                self._index += 1
                self._in_file = 0
            take = min(len(arr), self.max_tokens - self._in_file)
            self._sink.write(arr[:take])
            self._in_file += take
            self.tokens += take
            arr = arr[take:]
            if self._in_file == self.max_tokens:
                self._close_file()

    def _close_file(self) -> None:
        if self._sink is not None:
            self.records.append({**self._sink.close(), "tokens": self._in_file})
            self._sink = None

    def close(self) -> list[dict]:
        self._close_file()
        return self.records

    def abort(self) -> None:
        if self._sink is not None:
            self._sink.abort()
            self._sink = None


_DIGITS = re.compile(r"(\d+)")


def file_order(name) -> tuple:
    """Sort key reading runs of digits as numbers: shard_99999 < shard_100000 (a string sort puts it first)."""
    return tuple(int(part) if part.isdigit() else part for part in _DIGITS.split(str(name)))
