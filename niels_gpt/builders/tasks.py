"""One task of a plan: tokenize (or render) its items into part files, then write its receipt.

Files of task `<id>` in the work directory's `parts/`, renamed into place when complete, the receipt last (not
fsynced: the commit checks every part's size and xxh3-128 against the receipt; sources/digests.py says why
not sha256):

| file            | contents                                                                           |
|-----------------|------------------------------------------------------------------------------------|
| `<id>.bin`      | pretraining: every document's ids with its separator (EOT/EOS after it, or BOS     |
|                 | before it); chat: every usable example's rendered ids. Little-endian, the dtype    |
|                 | of the cache                                                                       |
| `<id>.mask.bin` | chat with a tokenizer's own template: uint8 per token, 1 = trained target          |
| `<id>.lens.npy` | int64 per item of the task, in order: > 0 its tokens (with the separator); <= 0    |
|                 | skipped, for the reason `skip_reasons[-n]` of the receipt (0 = empty_document)     |
| `<id>.origins.npy` | int64 [documents, 4] per document (chat: usable example) of the task, in order:   |
|                 | its origin (sources/origins.py; the input column the piece's index in the task)    |
| `<id>.json`     | the receipt: the task, items, tokens, skip reasons, the digests (`digests`) of what |
|                 | it read, bytes + xxh3-128 of each part, the separator, seconds, host and pid       |
| `<id>.started`  | host, pid and time, written when the task starts (who is working on what)          |

The ids are made as the one-process builder makes them (`encode_documents`, `writers.Budgeted.write`; `render`
for chats). A task needs only paths: the worker opens the tokenizer once per process and checks its sha256.
"""

from __future__ import annotations

import functools
import io
import json
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

import numpy as np

from niels_gpt import allocator
from niels_gpt.atomic import write_bytes_atomic
from niels_gpt.builders.encoding import ENCODE_BATCH_DOCS
from niels_gpt.builders.rendering import renderings
from niels_gpt.errors import CacheError, ConfigError, TokenizerError
from niels_gpt.formats.writers import Budgeted, HashingFile, check_range
from niels_gpt.long_documents import encode_documents
from niels_gpt.meta import RECEIPT_HASH, receipt_hash
from niels_gpt.sources.digests import digest
from niels_gpt.sources.documents import Rules, Skipped
from niels_gpt.sources.lines import range_digests
from niels_gpt.sources.records import Piece
from niels_gpt.sources.stream import Task, task_items
from niels_gpt.storage.upload import sweep_dead
from niels_gpt.storage.work import TASK_DIRS, WorkStore, fetch_tokenizer
from niels_gpt.tokenizer import load_tokenizer
from niels_gpt.tokenizer.base import document_separator
from niels_gpt.tokenizer.fast import SAMPLE_CHARS, check_sample, encoder_name, fast_encoder
from niels_gpt.urls import is_url

EMPTY = "empty_document"  # skip reason 0
_TOKENIZERS: dict[str, object] = {}


def parts_dir(work_dir: str | os.PathLike) -> Path:
    return Path(work_dir) / "parts"


def work_store(url: str) -> WorkStore:
    """The work URL's store, made once per process (a forked worker makes its own)."""
    return _store(str(url), os.getpid())


@functools.cache
def _store(url: str, pid: int) -> WorkStore:
    return WorkStore(url)


def _key(path: str, options: dict | None) -> str:
    return json.dumps([path, options or {}], sort_keys=True)


def keep_tokenizer(path: str, tokenizer, options: dict | None = None, plan=None) -> None:
    """Let tasks in this process, and in workers forked from it, use `tokenizer` instead of opening `path`; with
    `plan`, its fast encoder is made here and given the sample check (tokenizer/fast.py) on the plan's first
    documents, so that no forked worker repeats it (0.03 s of CPU each). A first task not on local files, or
    one that fails to read, leaves the check to each worker's first batch (the task names the error)."""
    _TOKENIZERS[_key(path, options)] = tokenizer
    fast = fast_encoder(tokenizer) if plan is not None else None
    if fast is None or plan.chat or not plan.tasks or any(
            p.get("kind") == "dataset" or is_url(p["item"]) for p in plan.tasks[0].pieces):
        return
    texts, chars = [], 0
    try:
        for item in task_items(plan.tasks[0], plan.rules, plan.signatures):
            if isinstance(item, str) and item and not item.isspace():
                texts.append(item)
                chars += len(item)
                if chars >= SAMPLE_CHARS:
                    break
    except Exception:  # noqa: BLE001 - the task meets the error again and names it
        return
    if texts:
        check_sample(tokenizer, fast, texts)


def _tokenizer(path: str, sha256: str, options: dict | None):
    key = _key(path, options)
    tok = _TOKENIZERS.get(key)
    if tok is None or tok.sha256 != sha256:  # not open yet, or the file changed since (a long-lived worker)
        _TOKENIZERS.pop(key, None)
        tok = _fetched_tokenizer(path, sha256, options) if is_url(path) else load_tokenizer(path, **(options or {}))
        _TOKENIZERS[key] = tok
    if tok.sha256 != sha256:
        raise TokenizerError(f"{path} on {socket.gethostname()} has sha256 {tok.sha256[:16]}…, the plan was "
                             f"made with {sha256[:16]}…; give every node the same tokenizer file")
    return tok


def _fetched_tokenizer(url: str, sha256: str, options: dict | None):
    """The copy the driver put in the work URL, fetched once per node; a copy that does not load as the
    tokenizer of that sha256 is removed (fetched again by the next task)."""
    local = fetch_tokenizer(url, sha256)
    try:
        tok = load_tokenizer(local, **(options or {}))
        if tok.sha256 != sha256:
            raise TokenizerError(f"{url}: the copy fetched on {socket.gethostname()} has sha256 {tok.sha256[:16]}…, "
                                 f"not the {sha256[:16]}… it is named by (changed in the store?); remove "
                                 f"{url.rsplit('/', 1)[0]}/ and run the same command again")
        return tok
    except BaseException:
        shutil.rmtree(local.parent, ignore_errors=True)
        raise


class _Skips:
    """Skip reasons of a task, numbered in order of first use (0 is always empty_document)."""

    def __init__(self):
        self.names = [EMPTY]

    def code(self, reason: str) -> int:
        if reason not in self.names:
            self.names.append(reason)
        return -self.names.index(reason)


@allocator.keeping  # in a Ray worker too (a forked processes worker inherits the driver's setting)
def run_task(task: dict, spec: dict, tokenizer_path: str, tokenizer_sha256: str, work_dir: str,
             tokenizer_options: dict | None = None) -> dict:
    """Tokenize (spec["chat"]: render) one task into its part files and return its receipt (also `<id>.json`).
    `spec`: the plan's `rules`, `chat`, and the signatures of the task's local inputs. At a URL `work_dir` the
    parts are written in a temporary directory, then uploaded (the receipt last)."""
    if is_url(work_dir):
        return _run_task_at_url(task, spec, tokenizer_path, tokenizer_sha256, work_dir, tokenizer_options)
    t0 = time.perf_counter()
    t = Task(**task)
    tok = _tokenizer(tokenizer_path, tokenizer_sha256, tokenizer_options)
    dtype = np.dtype(tok.token_dtype)
    parts = parts_dir(work_dir)
    parts.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(parts / f"{t.id}.started", _started(t), durable=False)
    rules = Rules(**{**spec["rules"], "chat_columns": tuple(spec["rules"]["chat_columns"])
                     if spec["rules"].get("chat_columns") else None})
    stream = task_items(t, rules, spec.get("signatures"), origins=True)
    skips = _Skips()
    origins: list[int] = []
    with range_digests() as read:
        if spec.get("chat"):
            files, lens, extra = _render_task(t, tok, dtype, parts, stream, skips, rules.on_bad_record, origins)
        else:
            files, lens, extra = _encode_task(t, tok, dtype, parts, stream, skips, origins)
    files["origins"] = _write_npy(parts / f"{t.id}.origins.npy", np.asarray(origins, dtype="<i8").reshape(-1, 4))
    # what this task read (its inputs were checked unchanged before and after), for a resume to compare against:
    # a byte range hashed as it was read, anything else read again here
    digests = [read.get((p["item"], p.get("start", 0), p.get("stop", -1))) or digest(Piece(**p)) for p in t.pieces]
    arr = np.asarray(lens, dtype="<i8")
    files["lens"] = _write_npy(parts / f"{t.id}.lens.npy", arr)
    tokens = int(arr[arr > 0].sum())
    if files["bin"]["bytes"] != tokens * dtype.itemsize:
        raise CacheError(f"task {t.id}: wrote {files['bin']['bytes']} bytes for {tokens} tokens; report this bug")
    receipt = {"task": t.to_json(), "id": t.id, "documents": len(lens), "empty_documents": int((arr == 0).sum()),
               "encoder": encoder_name(tok, chat=bool(spec.get("chat"))),
               "tokens": tokens, "token_dtype": dtype.str, "skip_reasons": skips.names, "digests": digests,
               "files": files, "seconds": round(time.perf_counter() - t0, 6), "host": socket.gethostname(),
               "pid": os.getpid(), "finished": time.time(), **extra}
    write_bytes_atomic(parts / f"{t.id}.json", (json.dumps(receipt, indent=1, sort_keys=True) + "\n").encode(),
                       durable=False)
    return receipt


def _started(t: Task) -> bytes:
    return json.dumps({"task": t.id, "host": socket.gethostname(), "pid": os.getpid(), "time": time.time()}).encode()


def _write_npy(path: Path, arr: np.ndarray) -> dict:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    data = buf.getvalue()
    write_bytes_atomic(path, data, durable=False)
    return {"bytes": len(data), RECEIPT_HASH: receipt_hash(data).hexdigest()}


def _run_task_at_url(task: dict, spec: dict, tokenizer_path: str, tokenizer_sha256: str, work_url: str,
                     tokenizer_options: dict | None) -> dict:
    t = Task(**task)
    for p in t.pieces:  # an input at a path of the driver's machine that this one does not have
        if p.get("kind") != "dataset" and not is_url(p["item"]) and not os.path.exists(p["item"]):
            raise ConfigError(f"{p['item']}: not found on {socket.gethostname()}, where task {t.id} runs: with a "
                              "--work-dir in an object store every input must be at a URL (s3://, gs://, ...) or at "
                              "the same path on every node: upload the inputs to the store and build from there")
    store = work_store(work_url)
    store.put_bytes(f"parts/{t.id}.started", _started(t))
    sweep_dead(Path(tempfile.gettempdir()), TASK_DIRS)  # those of this node's workers lost mid-task
    tmp = tempfile.mkdtemp(prefix=f"{TASK_DIRS}{os.getpid()}_")
    try:
        receipt = run_task(task, spec, tokenizer_path, tokenizer_sha256, tmp, tokenizer_options)
        local = parts_dir(tmp)
        for name in receipt["files"]:
            store.put_file(local / f"{t.id}{PART_SUFFIX[name]}", f"parts/{t.id}{PART_SUFFIX[name]}")
        store.put_file(local / f"{t.id}.json", f"parts/{t.id}.json")  # the receipt last: the parts are there
        return receipt
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _encode_task(t: Task, tok, dtype, parts: Path, stream, skips: _Skips, origins: list):
    sep = document_separator(tok)
    out = HashingFile(parts / f"{t.id}.bin", durable=False, receipt=True)
    # The builder's converter, unbudgeted: the same separators, casts and range check as a local build.
    convert = Budgeted(out, 0, sep.id, dtype, f"task {t.id} ({t.where()})", sep.position)
    lens: list[int] = []
    batch: list[str] = []
    where: list[int] = []  # index in lens of each document of batch
    try:
        for item, origin in stream:
            if isinstance(item, str) and item and not item.isspace():  # the builder's emptiness test
                batch.append(item)
                where.append(len(lens))
                lens.append(0)
                origins.extend(origin)
            else:
                lens.append(skips.code(item.reason if isinstance(item, Skipped) else EMPTY))
            if len(batch) == ENCODE_BATCH_DOCS:  # the ids do not depend on it: it bounds memory
                _flush(tok, convert, batch, where, lens)
        _flush(tok, convert, batch, where, lens)
        return {"bin": out.close()}, lens, {"separator": sep.describe()}
    except BaseException:
        out.abort()
        raise


def _flush(tok, convert: Budgeted, batch: list[str], where: list[int], lens: list[int]) -> None:
    """Encode `batch`, append its tokens, record its lengths (`convert.documents` numbers them in errors)."""
    if not batch:
        return
    docs = encode_documents(tok, batch, num_threads=1, arrays=True)
    convert.write(docs, len(docs[-1]) + 1, convert.documents)
    convert.documents += len(docs)
    for i, d in zip(where, docs, strict=True):
        lens[i] = len(d) + 1
    batch.clear()
    where.clear()


def _render_task(t: Task, tok, dtype, parts: Path, stream, skips: _Skips, on_bad_record: str, origins: list):
    stored_mask = not getattr(tok, "library_conventions", True)
    out = HashingFile(parts / f"{t.id}.bin", durable=False, receipt=True)
    mask = HashingFile(parts / f"{t.id}.mask.bin", durable=False, receipt=True) if stored_mask else None
    lens: list[int] = []
    try:
        pairs = renderings(tok, stream, on_bad_record, conv_of=lambda pair: pair[0], one_core=True)
        for k, ((_, origin), chat) in enumerate(pairs):
            if isinstance(chat, Skipped):
                lens.append(skips.code(chat.reason))
                continue
            if isinstance(chat, ConfigError):
                raise ConfigError(f"task {t.id} ({t.where()}) example {k}: {chat}") from chat
            ids = np.asarray(chat.ids, dtype=np.int64)
            check_range(ids, dtype, f"task {t.id} ({t.where()}) example {k}")
            out.write(ids.astype(dtype))
            if mask is not None:
                mask.write(np.asarray(chat.mask, dtype=np.uint8))
            lens.append(len(ids))
            origins.extend(origin)
        files = {"bin": out.close()}
        if mask is not None:
            files["mask"] = mask.close()
        return files, lens, {"stored_mask": stored_mask}
    except BaseException:
        out.abort()
        if mask is not None:
            mask.abort()
        raise


def load_receipt(work_dir: str | os.PathLike, task: Task, listing: dict[str, int] | None = None) -> dict | None:
    """The task's receipt when valid (same id and spec, parts of the recorded sizes, inputs that hash as when
    it ran), else None: the task runs again. `listing`: name -> size under a work URL's parts/."""
    remote = is_url(work_dir)
    parts = None if remote else parts_dir(work_dir)
    if remote and listing is None:
        listing = work_store(work_dir).sizes("parts")
    try:
        if remote:
            if f"{task.id}.json" not in listing:
                return None
            receipt = json.loads(work_store(work_dir).get_bytes(f"parts/{task.id}.json").decode("utf-8"))
        else:
            receipt = json.loads((parts / f"{task.id}.json").read_text(encoding="utf-8"))
    except (FileNotFoundError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(receipt, dict) or receipt.get("id") != task.id or receipt.get("task") != task.to_json():
        return None
    if "origins" not in (receipt.get("files") or {}) or not isinstance(receipt.get("encoder"), str):
        return None  # made before tasks wrote their documents' origins, or said which encoder ran: run again
    for name, rec in (receipt.get("files") or {}).items():
        name = f"{task.id}{PART_SUFFIX.get(name, '?')}"
        size = listing.get(name) if remote else (parts / name).stat().st_size if (parts / name).is_file() else None
        if not isinstance(rec, dict) or size is None or size != rec.get("bytes") or RECEIPT_HASH not in rec:
            return None  # (no RECEIPT_HASH: hashed by an earlier version with sha256; the task runs again)
    try:
        if receipt.get("digests") != [digest(Piece(**p)) for p in task.pieces]:
            return None  # an input changed since the task ran (even with its size and mtime put back)
    except OSError:
        return None
    return receipt


PART_SUFFIX = {"bin": ".bin", "mask": ".mask.bin", "lens": ".lens.npy", "origins": ".origins.npy"}
