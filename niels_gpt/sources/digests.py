"""What a task read, for its receipt (builders/tasks.py), and what a resume checks again: a piece's digest.

A byte range of JSON Lines is the xxh3-128 of its bytes; a run of a Parquet file's row groups, of the footer
and the bytes those row groups span; a run of an Arrow IPC file's record batches, of the schema and those
batches; a whole local file, its sha256; a URL, its version (ETag, checksum or mtime) and size; a dataset
shard, its id, config and split. A file cut into k tasks is not hashed whole k times.

Receipts (a task's reads and its part files) use xxh3-128: it tells a resume that a file changed or was damaged
as surely as sha256, at about 13x its speed (27 GB/s against 2 GB/s a core here); a task hashes every byte it
reads and writes, so sha256 there cost a build a tenth of its CPU. No user ever checks these digests; what
a user can check (meta.json's files and inputs) stays sha256.
"""

from __future__ import annotations

import contextlib
import os

from niels_gpt.meta import RECEIPT_HASH, receipt_digest, receipt_hash, sha256_file
from niels_gpt.sources.inputs import ask
from niels_gpt.sources.records import Piece
from niels_gpt.storage.fs import filesystem


def digest(piece: Piece) -> str:
    """What the content of a piece is, for receipts: the sha256 of a local file's bytes, the xxh3-128 of its
    range, a URL's version (ETag, checksum or mtime) and size, a dataset shard's id, config and split."""
    if piece.kind == "dataset":
        shuffled = f":shuffle({piece.shuffle_seed},{piece.shuffle_buffer})" if piece.shuffled else ""
        return f"dataset:{piece.item}:{piece.config}:{piece.split}:{piece.start}/{piece.stop}{shuffled}"
    if piece.remote:
        fs, path = filesystem(piece.item)
        info = ask(lambda: fs.info(path), piece.item, "reading")
        version = next((str(info[k]) for k in ("ETag", "etag", "md5Hash", "crc32c", "LastModified", "mtime",
                                                "last_modified") if info.get(k)), "")
        return f"remote:{info.get('size')}:{version}"
    if piece.stop >= 0 and piece.kind in (".jsonl", ".json"):  # a range: read in one call, as its task does
        with open(piece.item, "rb") as f:
            f.seek(piece.start)
            return receipt_digest(f.read(piece.stop - piece.start))
    if piece.stop >= 0 and piece.kind in (".parquet", ".arrow"):
        # a damaged file (footer unreadable, file not opening): the whole file's sha256, which no receipt of a
        # run holds, so its task runs again
        with contextlib.suppress(Exception):
            return _row_groups_digest(piece) if piece.kind == ".parquet" else _batches_digest(piece)
    return "sha256:" + sha256_file(piece.item)


def _row_groups_digest(piece: Piece) -> str:
    """The digest of a Parquet file's footer and of the bytes its row groups [start, stop) span: what their
    task reads (a file of k tasks is not hashed whole k times)."""
    import pyarrow.parquet as pq

    with open(piece.item, "rb") as f:
        meta = pq.ParquetFile(f).metadata
        chunks = [meta.row_group(g).column(c) for g in range(piece.start, piece.stop)
                  for c in range(meta.num_columns)]
        starts = [min(c.data_page_offset, c.dictionary_page_offset or c.data_page_offset) for c in chunks]
        lo, hi = min(starts), max(s + c.total_compressed_size for s, c in zip(starts, chunks, strict=True))
        f.seek(-8, os.SEEK_END)
        footer = int.from_bytes(f.read(4), "little") + 8
        f.seek(-footer, os.SEEK_END)
        h = receipt_hash(f.read(footer))
        f.seek(lo)
        h.update(f.read(hi - lo))
    return f"{RECEIPT_HASH}:rowgroups:{piece.start}-{piece.stop}:" + h.hexdigest()


def _batches_digest(piece: Piece) -> str:
    """The digest of an Arrow IPC file's schema and of its record batches [start, stop), each as written again
    by pyarrow (pyarrow does not give their offsets in the file)."""
    import pyarrow as pa

    with pa.OSFile(piece.item) as f:
        reader = pa.ipc.open_file(f)
        h = receipt_hash(reader.schema.serialize())
        for b in range(piece.start, piece.stop):
            h.update(reader.get_batch(b).serialize())
    return f"{RECEIPT_HASH}:batches:{piece.start}-{piece.stop}:" + h.hexdigest()
