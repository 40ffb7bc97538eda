"""One task of a plan: tokenize its documents into part files, then write its receipt.

Files of task `<id>` in the work directory's `parts/` (written under temporary names, renamed when
complete, the receipt last, so a receipt means the parts are whole; none of them is fsynced: the commit
reads every part it uses and checks its size and sha256 against the receipt, so a part lost or torn by a
power loss is caught there, never copied into a shard):

| file            | contents                                                                         |
|-----------------|----------------------------------------------------------------------------------|
| `<id>.bin`      | every non-empty document's ids with its separator (EOT/EOS after it, or BOS      |
|                 | before it), little-endian, the cache's dtype                                     |
| `<id>.lens.npy` | int64 per document of the task, in order: its tokens with the separator; 0 =     |
|                 | empty, skipped                                                                   |
| `<id>.json`     | the receipt: the task, documents, empty documents, tokens, bytes + sha256 of both |
|                 | files, the separator, seconds, host and pid                                      |
| `<id>.started`  | host, pid and time, written when the task starts (who is working on what)         |

The ids are made exactly as the local builder makes them: `encode_batch` (one thread) over runs of
documents, and the builder's own converter (`writers.Budgeted.write`: separators,
range check naming the document) writing into a hashed file. A task needs only paths: the tokenizer
is opened by its path, with the plan's conventions (--eos/--bos/--separator), in the worker (once per
process) and checked against the plan's sha256.
"""

from __future__ import annotations

import io
import json
import os
import socket
import time
from pathlib import Path

import numpy as np

from niels_gpt.atomic import write_bytes_atomic
from niels_gpt.builders.plan import Task, task_documents
from niels_gpt.encode import encode_documents
from niels_gpt.errors import CacheError, TokenizerError
from niels_gpt.formats.writers import Budgeted, HashingFile
from niels_gpt.meta import file_record
from niels_gpt.tokenizer import load_tokenizer
from niels_gpt.tokenizer.base import document_separator

# Documents per encode_batch call. The ids do not depend on it (each document is encoded on its own);
# it only bounds memory. NOTE: not imported from cache.build_cache, which imports torch: a Ray worker
# importing this module would pay ~1.5 s for a library it never uses.
ENCODE_DOCS = 256
_TOKENIZERS: dict[str, object] = {}


def parts_dir(work_dir: str | os.PathLike) -> Path:
    return Path(work_dir) / "parts"


def _key(path: str, options: dict | None) -> str:
    return json.dumps([path, options or {}], sort_keys=True)


def keep_tokenizer(path: str, tokenizer, options: dict | None = None) -> None:
    """Let tasks in this process, and in worker processes forked from it, use `tokenizer` (opened from
    `path` with `options`) instead of opening it again: a forked pool's workers then start at once."""
    _TOKENIZERS[_key(path, options)] = tokenizer


def _tokenizer(path: str, sha256: str, options: dict | None):
    key = _key(path, options)
    tok = _TOKENIZERS.get(key)
    if tok is None or tok.sha256 != sha256:  # not open yet, or the file changed since (a long-lived worker)
        tok = _TOKENIZERS[key] = load_tokenizer(path, **(options or {}))
    if tok.sha256 != sha256:
        raise TokenizerError(f"{path} on {socket.gethostname()} has sha256 {tok.sha256[:16]}…, the plan was "
                             f"made with {sha256[:16]}…; give every node the same tokenizer file")
    return tok


def run_task(task: dict, text_field: str, tokenizer_path: str, tokenizer_sha256: str, work_dir: str,
             tokenizer_options: dict | None = None) -> dict:
    """Tokenize one task into its part files and return its receipt (also written as `<id>.json`)."""
    t0 = time.perf_counter()
    t = Task(**task)
    tok = _tokenizer(tokenizer_path, tokenizer_sha256, tokenizer_options)
    dtype = np.dtype(tok.token_dtype)
    sep = document_separator(tok)
    parts = parts_dir(work_dir)
    parts.mkdir(parents=True, exist_ok=True)
    out = HashingFile(parts / f"{t.id}.bin", durable=False)
    write_bytes_atomic(parts / f"{t.id}.started", json.dumps(
        {"task": t.id, "host": socket.gethostname(), "pid": os.getpid(), "time": time.time()}).encode(),
        durable=False)
    # The builder's converter, unbudgeted: the same separators, casts and range check as a local build.
    convert = Budgeted(out, 0, sep.id, dtype, f"task {t.id} ({t.where()})", sep.position)
    lens: list[int] = []
    empty = 0
    batch: list[str] = []
    where: list[int] = []  # index in lens of each document of batch
    encoded = 0  # non-empty documents encoded so far (Budgeted.write numbers documents by it)
    try:
        for text in task_documents(t, text_field):
            if text and not text.isspace():  # the builder's emptiness test
                batch.append(text)
                where.append(len(lens))
            else:
                empty += 1
            lens.append(0)
            if len(batch) == ENCODE_DOCS:
                encoded = _flush(tok, convert, batch, where, lens, encoded)
        _flush(tok, convert, batch, where, lens, encoded)
        bin_rec = out.close()
    except BaseException:
        out.abort()
        raise
    lens_path = parts / f"{t.id}.lens.npy"
    arr = np.asarray(lens, dtype="<i8")
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    lens_bytes = buf.getvalue()
    write_bytes_atomic(lens_path, lens_bytes, durable=False)
    tokens = int(arr.sum())
    if bin_rec["bytes"] != tokens * dtype.itemsize:
        raise CacheError(f"task {t.id}: wrote {bin_rec['bytes']} bytes for {tokens} tokens; report this bug")
    receipt = {"task": t.to_json(), "id": t.id, "documents": len(lens), "empty_documents": empty,
               "tokens": tokens, "token_dtype": dtype.str, "separator": sep.describe(),
               "files": {"bin": bin_rec, "lens": file_record(lens_path, None, data=lens_bytes)},
               "seconds": round(time.perf_counter() - t0, 6), "host": socket.gethostname(), "pid": os.getpid(),
               "finished": time.time()}
    write_bytes_atomic(parts / f"{t.id}.json", (json.dumps(receipt, indent=1, sort_keys=True) + "\n").encode(),
                       durable=False)
    return receipt


def _flush(tok, convert: Budgeted, batch: list[str], where: list[int], lens: list[int], encoded: int) -> int:
    """Encode `batch`, append its tokens, record its lengths; returns the count of documents encoded."""
    if not batch:
        return encoded
    docs = encode_documents(tok, batch, num_threads=1)
    convert.write(docs, len(docs[-1]) + 1, encoded)
    for i, d in zip(where, docs, strict=True):
        lens[i] = len(d) + 1
    batch.clear()
    where.clear()
    return encoded + len(docs)


def load_receipt(work_dir: str | os.PathLike, task: Task) -> dict | None:
    """The task's receipt when it is valid for this task (same id and spec, part files of the recorded
    sizes), else None: such a task runs again."""
    parts = parts_dir(work_dir)
    path = parts / f"{task.id}.json"
    try:
        receipt = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(receipt, dict) or receipt.get("id") != task.id or receipt.get("task") != task.to_json():
        return None
    for name, suffix in (("bin", ".bin"), ("lens", ".lens.npy")):
        f = parts / f"{task.id}{suffix}"
        rec = receipt.get("files", {}).get(name)
        if not rec or not f.is_file() or f.stat().st_size != rec.get("bytes"):
            return None
    return receipt
