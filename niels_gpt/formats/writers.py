"""Streaming writers behind the cache builders: hashed files committed by rename, shards that roll over at a
byte target, per-split token budgets, and a writer thread that overlaps encoding.

A file is hashed as it is written and renamed into place when complete (`niels_gpt.atomic`). A shard is opened
only when a token arrives (no empty shard) and never exceeds its byte target, which counts uncompressed tokens
also with `compress="zstd"` (`shard_NNNNN.bin.zst`, niels_gpt/formats/zstd_shard.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

import numpy as np

from niels_gpt import _native
from niels_gpt.atomic import commit, tmp_name
from niels_gpt.constants import MANIFEST_NAME
from niels_gpt.errors import ConfigError
from niels_gpt.formats.base import RollingWriter, check_fits
from niels_gpt.formats.zstd_shard import FRAME_TOKENS, SUFFIX, FrameEncoder, check_compress
from niels_gpt.meta import RECEIPT_HASH, receipt_hash

SHARD_PATTERN = "shard_{:05d}.bin"


class HashingFile:
    """A file written under a temporary name, hashed as it is written, committed by rename. `receipt`: a build
    task's part, hashed with the receipts' algorithm (meta.RECEIPT_HASH) instead of sha256."""

    def __init__(self, final: Path, durable: bool = True, receipt: bool = False):
        self.final, self.durable = final, durable
        self.tmp = tmp_name(final)
        self.f = open(self.tmp, "wb")
        self.key = RECEIPT_HASH if receipt else "sha256"
        self.hasher = receipt_hash() if receipt else hashlib.sha256()
        self.bytes = 0

    def write(self, arr: np.ndarray) -> None:
        data = memoryview(np.ascontiguousarray(arr)).cast("B")
        self.f.write(data)
        self.hasher.update(data)
        self.bytes += data.nbytes

    def sync(self) -> None:
        """Flush what is written so far to disk, so the fsync at close has only the rest to write."""
        self.f.flush()
        getattr(os, "fdatasync", os.fsync)(self.f.fileno())  # macOS has no fdatasync

    def close(self) -> dict:
        self.f.close()
        commit(self.tmp, self.final, self.durable)
        return {"bytes": self.bytes, self.key: self.hasher.hexdigest()}

    def abort(self) -> None:
        self.f.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.tmp)


MIN_SHARD_BYTES = 512  # smaller shards only multiply files: 2-byte shards made 100,000+ files of one token


def check_shard_bytes(shard_bytes: int, flag: str = "shard_bytes") -> None:
    """Refuse shard sizes below MIN_SHARD_BYTES (every builder and `convert` call this before writing)."""
    if not isinstance(shard_bytes, int) or shard_bytes < MIN_SHARD_BYTES:
        raise ConfigError(f"{flag}={shard_bytes}: shards must hold at least {MIN_SHARD_BYTES} bytes (tiny shards only "
                          "multiply files: a 1 GB cache in 2-byte shards is 500 million files); the default is "
                          "128MiB, and 64MiB-512MiB suits most file systems")


class ShardWriter(RollingWriter):
    """Appends tokens to shard files of at most `shard_bytes`; never opens an empty shard. `close()` returns
    {shard name: record}.

    `compress`: None (raw shards) or "zstd" (frames of `frame_tokens` tokens, same tokens per shard)."""

    def __init__(self, split_dir: Path, dtype: np.dtype, shard_bytes: int, *, compress: str | None = None,
                 frame_tokens: int = FRAME_TOKENS):
        check_shard_bytes(shard_bytes)  # at least MIN_SHARD_BYTES: room for a token of any dtype
        check_compress(compress, frame_tokens)
        self.dir, self.dtype = split_dir, dtype
        self.compress, self.frame_tokens = compress, frame_tokens
        super().__init__(self._open_shard, shard_bytes // dtype.itemsize)

    def _name(self, index: int) -> str:
        return SHARD_PATTERN.format(index) + (SUFFIX if self.compress else "")

    def _open_shard(self, index: int):
        shard = HashingFile(self.dir / self._name(index))
        return FrameEncoder(shard, self.dtype, self.frame_tokens) if self.compress else shard

    def sync(self) -> None:
        if self._sink is not None:
            self._sink.sync()

    def close(self) -> dict[str, dict]:
        return {self._name(i): rec for i, rec in enumerate(super().close())}


class Budgeted:
    """Feeds EOT-terminated documents into one split's shards until its token budget is met.

    `plan` (calling thread) only counts, so the decision to read on never waits for a write; `write` (writer
    thread) turns a planned batch into tokens, range-checks and writes them."""

    def __init__(self, writer: ShardWriter, budget: int, eot: int, dtype: np.dtype, name: str,
                 position: str = "after"):
        # position "before": the separator (a BOS) starts every document instead of ending it; a cut
        # document then keeps its BOS and its first room - 1 content tokens
        self.writer, self.budget, self.eot, self.dtype, self.name = writer, budget, eot, dtype, name
        self.before = position == "before"
        self.documents = 0
        self.planned = 0
        self.cut: dict | None = None

    @property
    def full(self) -> bool:
        return self.planned >= self.budget

    def plan(self, ids: list[int], job: list) -> int:
        """Admit one document into `job`; returns the tokens it adds (EOT included, cut applied)."""
        n = len(ids) + 1
        room = self.budget - self.planned
        keep = min(n, room)
        if n > room:  # cut: the first room - 1 tokens, then EOT (every document ends with EOT)
            self.cut = {"document": self.documents, "kept_tokens": room, "document_tokens": n,
                        "kept_content_tokens": room - 1}
        if job and job[-1][0] is self:
            job[-1][1].append(ids)
            job[-1][2] = keep  # only the last document of a run can be cut
        else:
            job.append([self, [ids], keep, self.documents])
        self.documents += 1
        self.planned += keep
        return keep

    def write(self, docs: list, keep_last: int, first_doc: int) -> None:
        """Write a planned batch: each document with its separator, the last one cut to `keep_last` tokens."""
        native = _native.gather  # read per call: None where the C kernel is not built (or switched off)
        # C (gather.c): lists of ids ~3 ns a token under the GIL (ids_to_tokens); the fast encoder's uint32
        # arrays in one pass with the GIL released, separators checked too (arrays_to_tokens)
        lists = all(isinstance(d, list) for d in docs)
        kernel = None if native is None or self.before else native.ids_to_tokens if lists else \
            native.arrays_to_tokens if all(type(d) is np.ndarray and d.dtype == np.uint32 for d in docs) else None
        if kernel is not None:
            try:
                buf = kernel(docs, self.eot, self.dtype.itemsize, keep_last)
            except (OverflowError, ValueError, TypeError, BufferError):
                pass  # the numpy path below finds the document and raises the package's error
            else:
                arr = np.frombuffer(buf, dtype=self.dtype.newbyteorder("="))
                if lists and np.count_nonzero(arr == self.eot) != len(docs):
                    self._refuse_separator_inside(docs, first_doc)
                self.writer.write(arr.astype(self.dtype, copy=False))
                return
        # NOTE: whole-batch numpy calls, none per document (they would wait for the GIL behind the encode
        # threads): one concatenate, one range check, one count of the separators, one cast
        arrays = [d if isinstance(d, np.ndarray) else np.asarray(d, dtype=np.int64) for d in docs]
        if not arrays:
            return
        if keep_last < len(arrays[-1]) + 1:  # the cut document keeps keep_last - 1 tokens
            arrays[-1] = arrays[-1][:keep_last - 1]
        wide = np.result_type(*{a.dtype for a in arrays})
        sep = np.array([self.eot], dtype=wide)
        parts = [sep] * (2 * len(arrays))
        parts[int(self.before)::2] = arrays  # BOS-first: sep, doc, sep, doc...; else doc, sep, doc, sep...
        flat = np.concatenate(parts)
        if not np.can_cast(wide, self.dtype) and flat.size and (
                int(flat.max()) > np.iinfo(self.dtype).max or (wide.kind == "i" and int(flat.min()) < 0)):
            for j, a in enumerate(arrays):  # name the first document that does not fit
                check_range(a.astype(np.int64), self.dtype, f"{self.name} document {first_doc + j}")
        if np.count_nonzero(flat == self.eot) != len(arrays):
            self._refuse_separator_inside(arrays, first_doc)
        self.writer.write(flat.astype(self.dtype, copy=False))

    def _refuse_separator_inside(self, docs: list, first_doc: int) -> None:
        """A separator id inside a document's own tokens (an --eos that is ordinary text) would make two
        documents of one: refused, naming the document."""
        for j, d in enumerate(docs):
            if np.any(np.asarray(d) == self.eot):
                raise ConfigError(
                    f"{self.name} document {first_doc + j}: the document separator (id {self.eot}) occurs inside its "
                    "text, so documents could not be told apart; the token given to --eos/--bos is an ordinary "
                    "piece of text: choose a special token the text never produces (the tokenizer's own EOS or BOS)")


class WriterPipeline:
    """Writes planned batches on one background thread while the caller encodes the next (its numpy calls,
    hashing and writes release the GIL). At most one batch is in flight; `submit` and `close` re-raise the
    writer's error."""

    def __init__(self):
        from concurrent.futures import ThreadPoolExecutor

        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cache-writer")
        self.pending = None

    def wait(self) -> None:
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.result()

    def submit(self, job: list) -> None:
        self.wait()
        if job:
            self.pending = self.pool.submit(lambda: [sink.write(docs, keep, first) for sink, docs, keep, first in job])

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self.pool.shutdown(wait=True)


def check_range(ids: np.ndarray, dtype: np.dtype, where: str) -> None:
    """`check_fits` with a build's fix: the cache's token dtype."""
    check_fits(ids, dtype, where, "build with token_dtype='uint32-le'")


def refuse_packed_bins(path, command: str) -> None:
    """Packed SFT bins (pack-sft's manifest.json, its val/ split, or one of their files) are not a token stream:
    say so, and name what `command` reads instead."""
    p = Path(path)
    for d in (p, p.parent, p.parent.parent):
        manifest = d / MANIFEST_NAME
        if manifest.is_file() and b"memmap_padded_v1" in manifest.read_bytes()[:4096]:
            raise ConfigError(f"{path}: packed SFT bins (pack-sft's output, {manifest}), padded bins with loss masks, "
                              f"not a token stream; {command} reads token caches and token files: pass the SFT "
                              "cache they were packed from")
