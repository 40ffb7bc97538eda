"""Compressed token shards: independent zstd frames of a fixed number of tokens plus a frame index.

`build --compress zstd` and `convert --to niels --compress zstd` write `shard_NNNNN.bin.zst` instead of
`shard_NNNNN.bin`. The file is the zstd *seekable format* (zstd's contrib/seekable_format): a plain
`zstd -d shard_00000.bin.zst` restores the uncompressed shard byte for byte, and a reader decompresses
only the frames a window needs. Byte layout (all integers little-endian):

| offset | size | field |
|---|---|---|
| 0 | c_0 | frame 0: a zstd frame (RFC 8878) of tokens [0, F), content size and content checksum on |
| c_0 | c_1 | frame 1: tokens [F, 2F) |
| ... | | frame i: tokens [i*F, min((i+1)*F, N)); every frame but the last holds exactly F tokens |
| S = sum c_i | 4 | seek table: skippable-frame magic 0x184D2A5E |
| S+4 | 4 | skippable-frame size = 12 * n + 9 |
| S+8 + 12*i | 4 | entry i: compressed size c_i (bytes) |
| S+12 + 12*i | 4 | entry i: decompressed size d_i (bytes) = F * itemsize, the last (N - (n-1)*F) * itemsize |
| S+16 + 12*i | 4 | entry i: checksum: low 32 bits of XXH64(decompressed frame i), = the frame's own checksum |
| S+8 + 12*n | 4 | number of frames n = ceil(N / F) |
| S+12 + 12*n | 1 | seek table descriptor: 0x80 (checksums present; other bits 0) |
| S+13 + 12*n | 4 | seekable magic 0x8F92EAB1 (the file's last 4 bytes) |

N (the shard's tokens) and the dtype come from meta.json: `"compression": {"codec": "zstd", "frame_tokens": F,
"level": L, "layout": LAYOUT}` for the cache and `{"bytes", "sha256" (of the compressed file), "tokens": N,
"frames": n}` per file. `--shard-bytes` counts uncompressed bytes, so a compressed cache holds exactly the
shards (and windows) of the uncompressed one. The seek table is checked on open, each frame's size and
checksum when decompressed; `verify` decompresses every frame. Figures: docs/storage.md.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from niels_gpt.constants import META_NAME
from niels_gpt.errors import CacheError, CacheMismatchError, ConfigError
from niels_gpt.formats.base import TokenFile
from niels_gpt.meta import COMPRESSED_SUFFIX, numpy_dtype

CODEC = "zstd"
CODECS = (CODEC,)
FRAME_TOKENS = 4096  # 8 KiB of uint16 per frame: two pages, so a frame cache frees frames page by page
LEVEL = 3
LAYOUT = "zstd seekable format: independent frames of frame_tokens tokens, then a seek table (skippable frame)"
SUFFIX = COMPRESSED_SUFFIX  # shard_00000.bin.zst
SKIPPABLE_MAGIC = 0x184D2A5E
SEEKABLE_MAGIC = 0x8F92EAB1
DESCRIPTOR = 0x80  # bit 7: every entry carries a checksum
ENTRY = struct.Struct("<III")
FOOTER = struct.Struct("<IBI")  # frames, descriptor, magic


def zstandard():
    """The zstandard module, or a ConfigError saying how to install it."""
    try:
        import zstandard  # lazy: only compressed caches need it (an optional extra)
    except ImportError as exc:
        raise ConfigError("compressed shards (zstd) need the zstandard package: pip install 'niels_gpt[zstd]'") from exc
    return zstandard


def check_compress(compress: str | None, frame_tokens: int = FRAME_TOKENS) -> None:
    """Refuse an unknown codec or a frame size that is not a positive multiple of 2048 tokens."""
    if compress is None:
        return
    if compress not in CODECS:
        raise ConfigError(f"--compress {compress!r}: expected one of {', '.join(CODECS)} (or leave it out: uncompressed)")
    if isinstance(frame_tokens, bool) or not isinstance(frame_tokens, int) or frame_tokens < 2048 or frame_tokens % 2048:
        raise ConfigError(f"frame_tokens={frame_tokens!r}: a frame must hold a positive multiple of 2048 tokens "
                          "(whole pages, so the frame cache can release frames one by one)")
    zstandard()


def compression_meta(frame_tokens: int = FRAME_TOKENS, level: int = LEVEL) -> dict:
    """meta.json's "compression" entry of a cache written with these settings."""
    return {"codec": CODEC, "frame_tokens": frame_tokens, "level": level, "layout": LAYOUT}


class FrameEncoder:
    """Tokens in, zstd frames out to `sink` (write(uint8 array), close(), abort()); holds at most one frame.
    `close()` writes the last frame and the seek table and returns the sink's record plus "frames"."""

    def __init__(self, sink, dtype: np.dtype, frame_tokens: int = FRAME_TOKENS, level: int = LEVEL):
        self.sink, self.dtype, self.F = sink, np.dtype(dtype).newbyteorder("<"), frame_tokens
        self._c = zstandard().ZstdCompressor(level=level, write_checksum=True, write_content_size=True)
        self._buf = np.empty(frame_tokens, dtype=self.dtype)
        self._n = 0
        self._entries: list[bytes] = []

    def write(self, tokens: np.ndarray) -> None:
        while len(tokens):
            take = min(self.F - self._n, len(tokens))
            self._buf[self._n:self._n + take] = tokens[:take]
            self._n += take
            tokens = tokens[take:]
            if self._n == self.F:
                self._frame()

    def _frame(self) -> None:
        raw = self._buf[:self._n].tobytes()
        frame = self._c.compress(raw)
        self.sink.write(np.frombuffer(frame, dtype=np.uint8))
        self._entries.append(ENTRY.pack(len(frame), len(raw), int.from_bytes(frame[-4:], "little")))
        self._n = 0

    def close(self) -> dict:
        if self._n:
            self._frame()
        n = len(self._entries)
        table = b"".join(self._entries) + FOOTER.pack(n, DESCRIPTOR, SEEKABLE_MAGIC)
        self.sink.write(np.frombuffer(struct.pack("<II", SKIPPABLE_MAGIC, len(table)) + table, dtype=np.uint8))
        return {**self.sink.close(), "frames": n}

    def sync(self) -> None:
        self.sink.sync()

    def abort(self) -> None:
        self.sink.abort()


def is_compressed_meta(meta: dict) -> bool:
    return meta.get("compression") is not None


def frame_tokens_of(meta: dict, where) -> int:
    """meta.json's frame size, checked: a CacheError naming the field when it is wrong."""
    comp = meta.get("compression")
    if not isinstance(comp, dict) or comp.get("codec") not in CODECS:
        raise CacheError(f"{where}: compression {comp!r}: expected {{'codec': 'zstd', 'frame_tokens': ...}}; the "
                         "meta.json was edited or damaged: rebuild the cache")
    F = comp.get("frame_tokens")
    if isinstance(F, bool) or not isinstance(F, int) or F < 1:
        raise CacheError(f"{where}: compression.frame_tokens {F!r} is not a positive count; rebuild the cache")
    return F


class ZstdShard:
    """Random access to one compressed shard: the seek table checked on open, frames decompressed on demand.
    Pickles as its path and record (mapped again in each process)."""

    def __init__(self, path: str | os.PathLike, dtype, *, tokens: int, frame_tokens: int, expected_bytes: int,
                 frames: int | None = None):
        self.path, self.dtype = Path(path), np.dtype(dtype)
        self.tokens, self.F, self.expected_bytes, self.frames_recorded = int(tokens), int(frame_tokens), \
            int(expected_bytes), frames
        self._open()

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k not in ("_mm", "_d")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._open()

    def _bad(self, what: str) -> CacheMismatchError:
        return CacheMismatchError(f"{self.path}: {what}; the compressed shard or its meta.json record is damaged: "
                                  "rebuild the cache (or run verify for details)")

    def _open(self) -> None:
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            raise CacheError(f"{self.path}: compressed shard missing") from None
        with f:
            size = os.fstat(f.fileno()).st_size
            if size != self.expected_bytes:
                raise self._bad(f"{size} bytes now, meta.json says {self.expected_bytes}")
            if size < 8 + FOOTER.size:
                raise self._bad(f"{size} bytes: too short to hold a seek table")
            self._mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
        mm = self._mm
        n, desc, magic = FOOTER.unpack_from(mm, size - FOOTER.size)
        if magic != SEEKABLE_MAGIC:
            raise self._bad(f"seekable magic {magic:#010x} at its end, expected {SEEKABLE_MAGIC:#010x}")
        if desc != DESCRIPTOR:
            raise self._bad(f"seek table descriptor {desc:#04x}, expected {DESCRIPTOR:#04x} (checksums on)")
        want_n = -(-self.tokens // self.F)
        if n != want_n or (self.frames_recorded is not None and n != self.frames_recorded):
            raise self._bad(f"{n} frames in its seek table, expected {want_n} ({self.tokens} tokens / "
                            f"frame_tokens {self.F}; meta.json records {self.frames_recorded})")
        table_bytes = 8 + ENTRY.size * n + FOOTER.size
        start = size - table_bytes
        if start < 0:
            raise self._bad(f"a seek table of {n} frames does not fit in {size} bytes")
        skip_magic, skip_size = struct.unpack_from("<II", mm, start)
        if skip_magic != SKIPPABLE_MAGIC or skip_size != table_bytes - 8:
            raise self._bad(f"seek table header ({skip_magic:#010x}, {skip_size}) at byte {start}, expected "
                            f"({SKIPPABLE_MAGIC:#010x}, {table_bytes - 8})")
        entries = np.frombuffer(mm, dtype="<u4", count=3 * n, offset=start + 8).reshape(n, 3).astype(np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(entries[:, 0])])
        self.raw_sizes, self.checksums = entries[:, 1], entries[:, 2]
        if self.offsets[-1] != start:
            raise self._bad(f"frames of {self.offsets[-1]} bytes in the seek table, but the table starts at byte {start}")
        item = self.dtype.itemsize
        want = np.full(n, self.F * item, dtype=np.int64)
        if n:
            want[-1] = (self.tokens - (n - 1) * self.F) * item
        if not np.array_equal(self.raw_sizes, want):
            i = int(np.flatnonzero(self.raw_sizes != want)[0])
            raise self._bad(f"frame {i} decompresses to {self.raw_sizes[i]} bytes by its seek table, expected {want[i]}")
        self._d = zstandard().ZstdDecompressor()

    def frame(self, i: int) -> np.ndarray:
        """The tokens of frame i (read-only), decompressed and checked."""
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        if hi - lo < 4 or int.from_bytes(self._mm[hi - 4:hi], "little") != int(self.checksums[i]):
            raise self._bad(f"frame {i}: its checksum differs from the seek table's copy")
        with memoryview(self._mm)[lo:hi] as data:  # no copy of the compressed bytes
            try:
                raw = self._d.decompress(data, max_output_size=int(self.raw_sizes[i]))
            except Exception as exc:  # zstandard.ZstdError: a damaged frame, a checksum that does not match
                raise self._bad(f"frame {i} (bytes {lo}-{hi}) does not decompress ({exc})") from exc
        if len(raw) != self.raw_sizes[i]:
            raise self._bad(f"frame {i} decompressed to {len(raw)} bytes, expected {self.raw_sizes[i]}")
        return np.frombuffer(raw, dtype=self.dtype)

    def read(self, start: int, stop: int) -> np.ndarray:
        """Tokens [start, stop), decompressing only the frames they lie in (no cache: see readers/frames.py)."""
        if not 0 <= start <= stop <= self.tokens:
            raise IndexError(f"{self.path}: tokens [{start}, {stop}) outside [0, {self.tokens})")
        if start == stop:
            return np.zeros(0, dtype=self.dtype)
        first, last = start // self.F, (stop - 1) // self.F
        parts = [self.frame(i) for i in range(first, last + 1)]
        joined = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return joined[start - first * self.F:stop - first * self.F]

    def close(self) -> None:
        self._mm.close()

    # The array interface the format readers take a token file's payload by (convert, prepare-data): len() and
    # slices decompress only the frames they cover; anything else decompresses the whole shard.
    def __len__(self) -> int:
        return self.tokens

    def __getitem__(self, key):
        if isinstance(key, slice) and key.step in (None, 1):
            start, stop, _ = key.indices(self.tokens)
            return self.read(start, max(start, stop))
        return np.asarray(self)[key]

    def __array__(self, dtype=None, copy=None):
        whole = self.read(0, self.tokens)
        return whole if dtype is None else whole.astype(dtype)


@dataclass(frozen=True)
class ZstdTokenFile(TokenFile):
    """A compressed shard of our cache as a TokenFile: `open()` gives its ZstdShard, checked against its record."""

    frame_tokens: int = FRAME_TOKENS
    expected_bytes: int = 0
    frames: int | None = None

    def open(self):
        if self.count == 0:
            return np.empty(0, dtype=self.dtype)
        return ZstdShard(self.path, self.dtype, tokens=self.count, frame_tokens=self.frame_tokens,
                         expected_bytes=self.expected_bytes, frames=self.frames)


def open_compressed(path: str | os.PathLike, dtype, rec: dict, meta: dict) -> ZstdTokenFile:
    """Describe one `.bin.zst` shard of a compressed cache by its meta.json record (tokens, bytes, frames)."""
    tokens = rec.get("tokens")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise CacheMismatchError(f"{path}: meta.json records tokens={tokens!r} for this compressed shard; rebuild the "
                                 "cache")
    return ZstdTokenFile(str(path), np.dtype(dtype), 0, tokens, frame_tokens=frame_tokens_of(meta, path),
                         expected_bytes=int(rec.get("bytes", -1)), frames=rec.get("frames"))


def verify_compressed(cache: Path, meta: dict) -> list[str]:
    """verify's check of a compressed cache: one problem per shard whose seek table or frames fail, through the
    reader's own code (sizes and sha256 are check_files'; a shard of the wrong size is left to it)."""
    if not is_compressed_meta(meta):
        return []
    try:
        F = frame_tokens_of(meta, cache / META_NAME)
    except CacheError as exc:
        return [str(exc)]
    dtype = numpy_dtype(meta.get("token_dtype"))
    out = []
    for rel, rec in sorted(meta.get("files", {}).items()):
        path = cache / rel
        if not rel.endswith(SUFFIX) or not isinstance(rec, dict) or not path.is_file() or \
                path.stat().st_size != rec.get("bytes"):
            continue
        try:
            shard = ZstdShard(path, dtype, tokens=rec.get("tokens", 0), frame_tokens=F, expected_bytes=rec["bytes"],
                              frames=rec.get("frames"))
            try:
                for i in range(len(shard.raw_sizes)):
                    shard.frame(i)
            finally:
                shard.close()
        except CacheError as exc:
            out.append(str(exc).split("; the compressed shard", 1)[0])
    return out
