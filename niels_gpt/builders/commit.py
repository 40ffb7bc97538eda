"""The commit: part files, in plan order, into the final shards and meta.json, exactly as a local build.

The tasks' documents are walked as the one-process builder's stream (runs of ENCODE_BATCH_DOCS, global across
tasks), admitted through the same `Admission`, `Budgeted` and `ShardWriter`, and each admitted run of tokens
is copied from the part straight into the shard. A part holds each document with its separator: a cut
document is its prefix (BOS first) or its first tokens then an EOT. Each part's digest is checked against
its receipt when reused from an earlier run, written on another host, or read from a work URL (parts are not
fsynced: this check vouches for them after a crash or a transfer); a part that this run's workers on this host
just wrote and hashed is not hashed again. Cost: one read of each part, one sha256 of each shard; no tokenization.

The SFT commit (`commit_sft`): the rendered parts of a chat build's tasks, in plan order, through the
one-process builder's `SFTWriter`, so the draws, files and meta.json are the same.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from niels_gpt.builders.common import start_build
from niels_gpt.builders.encoding import ENCODE_BATCH_DOCS
from niels_gpt.builders.origins import InputIndex, input_table
from niels_gpt.builders.pretrain import Admission, check_budgets, open_splits, pretrain_meta
from niels_gpt.builders.sft import SFTWriter, check_sft_settings, sft_meta
from niels_gpt.builders.tasks import PART_SUFFIX, parts_dir, work_store
from niels_gpt.errors import CacheError
from niels_gpt.meta import RECEIPT_HASH, receipt_hash, write_meta
from niels_gpt.sources.origins import OriginLog
from niels_gpt.urls import is_url

PART_READERS = 8  # threads reading a work URL's part files ahead of the commit
PARTS_AHEAD = 8  # receipts whose parts are read ahead (memory: their part files)
WRITTEN_NOW = "written_now"  # a receipt key the driver adds (never on disk): its parts were written by this run here


class _Doc:
    """A document as Budgeted.plan sees it: len() is its content tokens (without its separator). `mask`: an
    SFT part's mask file, beside `part`."""

    __slots__ = ("part", "start", "n", "origin", "mask")

    def __init__(self, part: np.ndarray, start: int, n: int, origin=None, mask: np.ndarray | None = None):
        self.part, self.start, self.n, self.origin, self.mask = part, start, n, origin, mask

    def __len__(self) -> int:
        return self.n - 1


def load_part(work_dir, receipt: dict, names: tuple[str, ...],
              fetched: dict[str, Future] | None = None) -> list[np.ndarray]:
    """The task's part files (`names` of bin, mask, lens) as arrays, each file's sha256 checked against the
    receipt. `fetched`: a work URL's part files being read ahead (`PartsAhead`), by name."""
    remote = is_url(work_dir)
    parts = parts_dir(work_dir)
    out = []
    for name in names:
        rel = f"parts/{receipt['id']}{PART_SUFFIX[name]}"
        if remote:  # a work URL (storage/work.py): every read bounded, a stalled store named
            path = work_store(work_dir).where(rel)
            try:
                data = fetched[name].result() if fetched else work_store(work_dir).get_bytes(rel)
            except FileNotFoundError:
                work_store(work_dir).remove(f"parts/{receipt['id']}.json")
                raise CacheError(f"{path}: missing, though its receipt is there; the receipt is removed: run the "
                                 "same command again to redo that task") from None
        else:
            path = parts / f"{receipt['id']}{PART_SUFFIX[name]}"
            data = path.read_bytes()
        trusted = receipt.get(WRITTEN_NOW) and not remote
        if not trusted and receipt_hash(data).hexdigest() != receipt["files"][name].get(RECEIPT_HASH):
            if remote:
                work_store(work_dir).remove(f"parts/{receipt['id']}.json")
            with contextlib.suppress(FileNotFoundError):
                (parts / f"{receipt['id']}.json").unlink()  # so that a rerun redoes this task
            raise CacheError(f"{path}: {RECEIPT_HASH} digest differs from its receipt (the part was changed or damaged); its "
                             "receipt is removed: run the same command again to redo that task")
        if name in ("lens", "origins"):
            out.append(np.load(io.BytesIO(data), allow_pickle=False))
        else:
            out.append(np.frombuffer(data, dtype=np.dtype(receipt["token_dtype"]) if name == "bin" else np.uint8))
    return out


class PartsAhead:
    """A work URL's part files read on PART_READERS threads, for the receipt being committed and the next
    PARTS_AHEAD that `ready(n)` knows (builders/parallel.py OrderedReceipts): one part at a time, the commit
    waited a store's answer and transfer per file. Only known receipts are read: none is waited for here."""

    def __init__(self, work_dir, names: tuple[str, ...], ready: Callable[[int], list[dict]] | None):
        self.store, self.names, self.ready = work_store(work_dir), names, ready or (lambda n: [])
        self.pool = ThreadPoolExecutor(PART_READERS, thread_name_prefix="parts")
        self.reading: dict[str, dict[str, Future]] = {}  # receipt id -> its files' reads, by name

    def _read(self, receipt: dict) -> dict[str, Future]:
        if receipt["id"] not in self.reading:
            self.reading[receipt["id"]] = {n: self.pool.submit(self.store.get_bytes, f"parts/{receipt['id']}"
                                                               f"{PART_SUFFIX[n]}") for n in self.names}
        return self.reading[receipt["id"]]

    def take(self, receipt: dict) -> dict[str, Future]:
        """The reads of `receipt`'s files (started now if not yet), after starting those of the next ones known."""
        mine = self._read(receipt)
        del self.reading[receipt["id"]]
        for nxt in self.ready(PARTS_AHEAD):
            self._read(nxt)
        return mine

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)  # a read under way ends within the store's limits


def _documents(work_dir, receipts: Iterable[dict], encoders: Counter, between: Callable[[], None] | None = None,
               index: InputIndex | None = None, mask: bool = False) -> Iterator[_Doc | str]:
    """Every item of the plan in order: a _Doc, or the skip reason of a record that is none. `between` runs
    after each part, before the next receipt is asked for (which may wait for its task). `encoders`: counts the
    tasks by the encoder each ran (meta.json's record). `index`: each _Doc carries its origin
    (builders/origins.py). `mask`: each _Doc carries its part's mask file. A work URL's parts are read ahead
    (`PartsAhead`) for the receipts whose `ready` says come next."""
    names = ("bin", "mask", "lens") if mask else ("bin", "lens")
    names += ("origins",) if index is not None else ()
    ahead = PartsAhead(work_dir, names, getattr(receipts, "ready", None)) if is_url(work_dir) else None
    try:
        for k, receipt in enumerate(receipts):
            if k and between is not None:
                between()
            encoders[receipt["encoder"]] += 1
            arrays = load_part(work_dir, receipt, names, ahead.take(receipt) if ahead is not None else None)
            rows = None
            if index is not None:
                rows = iter([index.row(receipt["task"]["pieces"], o) for o in arrays.pop().tolist()])
            tokens, lens = arrays[0], arrays[-1]
            masks = arrays[1] if mask else None
            start = 0
            for n in lens.tolist():
                if n <= 0:  # a skipped record, for the reason skip_reasons[-n] (tasks.py: 0 is an empty document)
                    yield receipt["skip_reasons"][-n]
                else:
                    yield _Doc(tokens, start, n, None if rows is None else next(rows), masks)
                    start += n
    finally:
        if ahead is not None:
            ahead.close()


def _write(job: list, eot: int, dtype: np.dtype, before: bool) -> None:
    """Copy one planned run of documents (what Budgeted.write would convert) into its shards."""
    eot_arr = np.array([eot], dtype=dtype)
    after = not before
    for sink, docs, keep_last, _first in job:
        w = sink.writer
        part, a, b = None, 0, 0
        for k, d in enumerate(docs):
            n = d.n if k < len(docs) - 1 else keep_last
            cut = n < d.n and after  # a cut BOS-first document is its first n tokens: no EOT to add
            end = d.start + (n - 1 if cut else n)
            if d.part is part and d.start == b:
                b = end
            else:
                if part is not None and b > a:
                    w.write(part[a:b])
                part, a, b = d.part, d.start, end
            if cut:  # the cut document keeps n - 1 tokens and its EOT
                if b > a:
                    w.write(part[a:b])
                w.write(eot_arr)
                part = None
        if part is not None and b > a:
            w.write(part[a:b])


def commit(work_dir, receipts: Iterable[dict], out_dir, *, tokenizer, max_train_tokens: int, max_val_tokens: int,
           shard_bytes: int, seed: int, dataset_name: str | None = None, dataset_config: str | None = None,
           streaming: bool = False, source: dict | Callable[[], dict] | None = None,
           final: str | os.PathLike | None = None, val_frac: float | None = None, tokenizer_path: str | None = None,
           compress: str | None = None, plan=None) -> dict:
    """Write the cache at `out_dir` from the parts of `receipts` (in plan order), pulling no more once the
    budgets are met; returns meta. `final`: where a staged `out_dir` will live (its name is the dataset's).
    `plan`: whose inputs the origins name (None: no origins). The rest: as build_pretrain_cache's."""
    check_budgets(max_train_tokens, max_val_tokens, val_frac, final or out_dir)
    out = Path(out_dir)
    dtype = np.dtype(tokenizer.token_dtype)
    budgets = (max_train_tokens, max_val_tokens)
    separator, writers, sinks = open_splits(out, tokenizer, dtype, budgets, shard_bytes, compress)
    skipped: Counter = Counter()
    exhausted = False
    log = OriginLog(None) if plan is not None else None
    try:
        admission = Admission(sinks, val_frac, seed)

        def between() -> None:
            # the shard written so far goes to disk while the driver waits for the next task, so the
            # fsync that closes the last shard, after the last task, has one part's tokens to write
            for w in writers.values():
                w.sync()

        index = InputIndex(plan.inputs) if plan is not None else None
        encoders: Counter = Counter()  # the tasks committed, by the encoder each ran (meta.json's record)
        docs = _documents(work_dir, receipts, encoders, between, index)
        while batch := list(itertools.islice(docs, ENCODE_BATCH_DOCS)):
            reasons = Counter(d for d in batch if isinstance(d, str))
            skipped["empty_document"] += reasons.pop("empty_document", 0)  # the key is there, as the builder's
            skipped.update(reasons)
            job: list = []
            stop = False
            for d in batch:
                if isinstance(d, str):
                    continue
                if admission.admit(d, job) is None:
                    stop = True
                    break
                if log is not None:
                    log.note({"val": sinks["val"].documents, "train": sinks["train"].documents}, d.origin)
            _write(job, separator.id, dtype, separator.position == "before")
            if stop:
                break
        else:
            exhausted = True
        records = {f"{s}/{name}": rec for s in ("train", "val") for name, rec in writers[s].close().items()}
        if log is not None:
            log.table = input_table(plan.inputs, plan.kinds, plan.config, plan.split)
            records.update(log.write(out, {s: sinks[s].documents for s in ("train", "val")}))
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    meta = pretrain_meta(tokenizer, dtype, Path(final) if final is not None else out, writers=writers, sinks=sinks,
                         records=records, separator=separator, seed=seed, dataset_name=dataset_name,
                         dataset_config=dataset_config, streaming=streaming, source=source, own_split=False,
                         exhausted=exhausted, skipped=skipped, shard_bytes=shard_bytes, shuffle_buffer=None,
                         val_frac=val_frac, tokenizer_path=tokenizer_path, origins=log is not None,
                         encoders=encoders)
    write_meta(str(out), meta)
    return meta


def commit_sft(work_dir, receipts: Iterable[dict], out_dir, *, tokenizer, val_frac: float, seed: int,
               dataset_name: str | None = None, dataset_config: str | None = None, streaming: bool = False,
               source: dict | Callable[[], dict] | None = None, final: str | os.PathLike | None = None,
               tokenizer_path: str | None = None, plan=None) -> dict:
    """Write the SFT cache at `out_dir` from the parts of `receipts` (in plan order); returns meta. `plan`: the
    build's plan, whose inputs the examples' origins name (builders/origins.py); None writes no origins."""
    check_sft_settings(val_frac, seed)
    out = Path(out_dir)
    dtype = np.dtype(tokenizer.token_dtype)
    stored_mask = not getattr(tokenizer, "library_conventions", True)
    start_build(out, [])
    skipped, encoders = Counter(), Counter()  # encoders: the tasks by the encoder each ran (meta.json's record)
    writer = SFTWriter(out, dtype, stored_mask=stored_mask, val_frac=val_frac, seed=seed, origins=plan is not None)
    index = InputIndex(plan.inputs) if plan is not None else None
    try:
        for d in _documents(work_dir, receipts, encoders, index=index, mask=stored_mask):
            if isinstance(d, str):
                skipped[d] += 1
                continue
            end = d.start + d.n
            writer.add(d.part[d.start:end], None if d.mask is None else d.mask[d.start:end], d.origin)
        if plan is not None:
            writer.log.table = input_table(plan.inputs, plan.kinds, plan.config, plan.split)
        records = writer.close()
    except BaseException:
        writer.abort()
        raise
    meta = sft_meta(tokenizer, dtype, Path(final) if final is not None else out, writer, records=records, seed=seed,
                    val_frac=val_frac, skipped=skipped, dataset_name=dataset_name, dataset_config=dataset_config,
                    streaming=streaming, source=source, tokenizer_path=tokenizer_path, encoders=encoders)
    write_meta(str(out), meta)
    return meta

