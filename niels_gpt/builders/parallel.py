"""A build's tasks on local processes or Ray, committed in plan order; resumed from receipts.

- The work directory (default `<out>.build/`, so an interrupted rebuild leaves the old cache as it was) holds
  plan.json and each task's parts and receipt, on a filesystem every worker sees or at a URL (storage/work.py).
  After a successful commit only what the build wrote is removed (unless `keep_parts`), the directory itself
  only when a run of this build made it.
- Resuming: the same command again reuses every task with a valid receipt (tasks.load_receipt).
- The commit takes parts in plan order while tasks finish; once both budgets are met, queued tasks are dropped.
- A failed task fails the build when the commit reaches it, naming the task, its input range and the record;
  finished tasks keep their receipts for the rerun.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from niels_gpt.atomic import TMP_SUFFIX, write_bytes_atomic
from niels_gpt.builders.commit import WRITTEN_NOW, commit, commit_sft
from niels_gpt.builders.common import summarize
from niels_gpt.builders.executors import WorkerDied, make_executor
from niels_gpt.builders.tasks import keep_tokenizer, load_receipt, parts_dir, run_task, work_store
from niels_gpt.errors import CacheError, ConfigError, NielsGPTError, OutOfSpaceError
from niels_gpt.output_guard import PLAN_NAME, check_output
from niels_gpt.progress import progress_bar
from niels_gpt.sources.lines import hash_ahead
from niels_gpt.sources.stream import Plan, check_unchanged
from niels_gpt.staging import SPACE_ERRNOS, build_aside, human_bytes
from niels_gpt.storage.fs import scheme_of
from niels_gpt.storage.upload import sweep_dead
from niels_gpt.storage.work import OURS, TASK_DIRS, WorkStore, check_work_url, upload_tokenizer
from niels_gpt.tokenizer.find import recorded_path

RECEIPT_READERS = 16  # threads reading a work URL's receipts when a build resumes


class Progress:
    """Tasks done and tokens/s across every worker (niels_gpt/progress.py)."""

    def __init__(self, total_tasks: int, reused: int, enabled: bool | None):
        self.t0 = time.perf_counter()
        self.tokens = 0
        self.bar = progress_bar(total=total_tasks, initial=reused, unit="task", desc="build", progress=enabled)

    def task_done(self, receipt: dict) -> None:
        self.tokens += receipt["tokens"]
        rate = self.tokens / max(time.perf_counter() - self.t0, 1e-9)
        self.bar.set_postfix_str(f"{rate / 1e6:.2f} Mtok/s", refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


class OrderedReceipts:
    """Receipts in plan order (iterate once), running the missing tasks `window` at a time on the executor.
    `ready(n)`: the receipts of the next n tasks not yet given that are known without waiting (reused, or of
    tasks already finished), so the commit can fetch their parts ahead."""

    def __init__(self, plan: Plan, reused: dict[int, dict], executor, args: tuple, progress: Progress,
                 counters: dict):
        self.plan, self.reused, self.executor, self.args = plan, reused, executor, args
        self.progress, self.counters = progress, counters
        self.results: dict[int, tuple] = {}  # task index -> (receipt, error) of a finished task not yet given
        self.given = 0  # tasks of the plan given so far

    def ready(self, n: int) -> list[dict]:
        out = []
        for t in self.plan.tasks[self.given:self.given + n]:
            receipt, error = (self.reused[t.index], None) if t.index in self.reused else self.results.get(t.index, (None, 1))
            if error is not None:
                break
            out.append(receipt)
        return out

    def __iter__(self) -> Iterator[dict]:
        plan, reused, executor, args, counters = self.plan, self.reused, self.executor, self.args, self.counters
        todo = [t for t in plan.tasks if t.index not in reused]
        window = max(1, executor.window)
        results = self.results
        inflight = 0
        nxt = 0
        for t in plan.tasks:
            self.given += 1
            if t.index in reused:
                counters["read"] += [p["item"] for p in t.pieces]
                yield reused[t.index]
                continue
            while t.index not in results:
                while nxt < len(todo) and inflight < window:
                    task = todo[nxt]
                    spec = dict(args[0], signatures={p["item"]: plan.signatures[p["item"]] for p in task.pieces
                                                     if p["item"] in plan.signatures})
                    executor.submit(task.index, run_task, task.to_json(), spec, *args[1:])
                    nxt += 1
                    inflight += 1
                for key, receipt, error in executor.wait():
                    inflight -= 1
                    results[key] = (receipt, error)
                    if error is None:
                        counters["ran"] += 1
                        counters["task_seconds"] += receipt["seconds"]
                        counters["tokenized"] += receipt["tokens"]
                        self.progress.task_done(receipt)
            receipt, error = results.pop(t.index)
            if error is not None:
                raise task_error(t, error, counters["ran"] + len(reused), len(plan.tasks))
            counters["read"] += [p["item"] for p in t.pieces]
            # parts this run's workers on this host just wrote and hashed: the commit does not hash them again
            yield {**receipt, WRITTEN_NOW: receipt.get("host") == socket.gethostname()}


def task_error(t, error: BaseException, done: int, total: int) -> Exception:
    """The one error a failed task fails the build with: the task, its input range, and how to resume."""
    hint = (f"; {done} of {total} tasks are finished and kept: fix the input and run the same command again to "
            "resume")
    if isinstance(error, WorkerDied):
        out = CacheError(f"task {t.id} ({t.where()}): {error}{hint}")
    elif isinstance(error, OSError) and error.errno in SPACE_ERRNOS:
        return disk_full(error, t, hint)
    elif isinstance(error, NielsGPTError):
        out = type(error)(f"task {t.id} ({t.where()}): {error}{hint}")
    else:
        out = CacheError(f"task {t.id} ({t.where()}) failed: {type(error).__name__}: {error}{hint}")
    out.__cause__ = error
    return out


def disk_full(error: OSError, t, hint: str) -> OutOfSpaceError:
    """One line for a task that filled the disk (or a quota): the file, what is free there."""
    path = Path(error.filename) if getattr(error, "filename", None) else None
    free = ""
    if path is not None:
        with contextlib.suppress(OSError):
            free = f": free {human_bytes(shutil.disk_usage(path.parent).free)} there now"
    what = "disk quota exceeded" if error.errno == errno.EDQUOT else "disk full"
    return OutOfSpaceError(error.errno, f"{what} writing {path or 'a part file'}{free} (task {t.id}, {t.where()}); "
                           "the cache was not changed: free space there, or give --work-dir on a disk with room"
                           f"{hint.replace('fix the input and run', 'then run')}")


def tokenizer_ref(tok) -> str:
    """An absolute path for a file or directory (a Ray worker runs elsewhere), else the name (cl100k_base)."""
    path = Path(tok.model_path)
    return str(path.resolve()) if path.exists() else tok.model_path


def run_parallel(spec, plan: Plan, tok, out: Path, *, executor: str, log, work: Path | str, workers: int | None,
                 val_budget: int) -> dict:
    """Run the plan's tasks on `executor` and commit them into `out` (`spec`: builders/run.py's BuildSpec);
    returns the summary's facts."""
    target = spec.extra.get("out_url") or os.path.abspath(out)  # the output this work directory is for
    ref = tokenizer_ref(tok)

    def plan_json(created: bool) -> bytes:
        return (json.dumps({**plan.to_json(), "work_dir_created": created, "out": target}, indent=1) + "\n").encode()

    if isinstance(work, Path):
        work = check_output(work, kind="work", flag="--work-dir", inputs=spec.sources, others=[("--out", out)])
        # removed at the end only if a run of ours (this one, or the one it resumes) made it
        created = not work.exists() or _previous_plan(work).get("work_dir_created") is True
        work.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(work / PLAN_NAME, plan_json(created))
        listing = None
    else:  # a prefix in an object store (storage/work.py): tasks upload their parts, the commit reads them there
        if scheme_of(work) == "memory" and executor != "inprocess":
            raise ConfigError(f"--work-dir {work}: memory:// lives in this process alone, and the tasks of --executor "
                              f"{executor} run in other processes: give a local directory, or a URL of a store every "
                              "worker reaches (s3://, gs://)")
        if plan.tokenizer_options.get("chat_template"):
            raise ConfigError(f"--chat-template with --work-dir {work}: the tasks fetch the tokenizer from the work "
                              "URL with the files beside it, not a template file of this machine; put the template "
                              "in a tokenizer_config.json (its chat_template field) or chat_template.jinja beside the "
                              "model instead")
        store = work_store(work)
        sweep_dead(Path(tempfile.gettempdir()), TASK_DIRS)  # local tasks of a killed run of this machine
        created, found = check_work_url(store, target)
        created = created or not found
        store.put_bytes(PLAN_NAME, plan_json(created))
        if Path(ref).exists():  # a file of the driver's: the tasks fetch it from the store by its sha256
            ref = upload_tokenizer(store, ref, tok.sha256, found)
        listing = store.sizes("parts")
    # a work URL: its receipts read on RECEIPT_READERS threads (one request each; a store answers in ~20-50 ms)
    with ThreadPoolExecutor(1 if listing is None else RECEIPT_READERS, thread_name_prefix="receipts") as pool:
        found = pool.map(lambda t: load_receipt(work, t, listing), plan.tasks)
        reused = {t.index: r for t, r in zip(plan.tasks, found, strict=True) if r is not None}
    args = ({"rules": plan.rules._asdict(), "chat": plan.chat}, ref, tok.sha256, str(work), plan.tokenizer_options)
    # before a pool forks: its workers inherit the tokenizer and its checked fast encoder (meta.json records it)
    keep_tokenizer(ref, tok, plan.tokenizer_options, plan)
    ex = make_executor(executor, workers=workers, ray_address=spec.ray_address, retries=spec.retries,
                       timeout=spec.extra.get("connect_timeout"))
    where = ex.describe()
    log(f"build: {len(plan.tasks)} tasks ({len(reused)} with a valid receipt, reused) on {where}; work directory "
        f"{work}")
    counters = {"ran": 0, "task_seconds": 0.0, "tokenized": 0, "read": []}
    bar = Progress(len(plan.tasks), len(reused), spec.progress)

    def described() -> dict:
        check_unchanged(plan, sorted(set(counters["read"]) & set(plan.signatures)))
        return plan.describe()

    receipts = OrderedReceipts(plan, reused, ex, args, bar, counters)
    # meta.json's sha256 of each local input, hashed while the workers run instead of after the last task
    stop = threading.Event()  # set when the build ends: a failed one does not wait for the rest to be hashed
    local = [name for name, kind in zip(plan.inputs, plan.kinds or [""] * len(plan.inputs), strict=True)
             if kind != "dataset" and "://" not in name]
    hashing = threading.Thread(target=hash_ahead, args=(local, stop), name="input-sha256", daemon=True)
    hashing.start()
    common = dict(tokenizer=tok, seed=spec.seed, dataset_name=spec.name or out.name, dataset_config=spec.hf_config,
                  streaming=plan.streaming, source=described, final=out, tokenizer_path=recorded_path(tok, out))
    try:
        with build_aside(out) as stage:
            if spec.chat:
                commit_sft(work, receipts, stage, val_frac=spec.val_frac or 0.0, plan=plan, **common)
            else:
                commit(work, receipts, stage, max_train_tokens=spec.max_tokens, max_val_tokens=val_budget,
                       shard_bytes=spec.shard_bytes, val_frac=spec.val_frac, compress=spec.compress, plan=plan,
                       **common)
    finally:
        ex.cancel()
        ex.close()
        bar.close()
        stop.set()
        hashing.join()
    if not spec.keep_parts:
        if isinstance(work, Path):
            remove_work(work, created=created)
        else:
            remove_work_url(work_store(work))
    return summarize(out, executor=where, tasks=len(plan.tasks), ran=counters["ran"], reused=len(reused),
                     task_seconds=counters["task_seconds"], tokenized=counters["tokenized"])


def _previous_plan(work: Path) -> dict:
    try:
        doc = json.loads((work / PLAN_NAME).read_text("utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def remove_work(work: Path, *, created: bool) -> None:
    """Delete what the build wrote in `work`, then the directories if a run of ours created them and they are
    empty: a --work-dir the user gave keeps everything else it holds."""
    parts = parts_dir(work)
    if parts.is_dir():
        for f in parts.iterdir():
            if f.is_file() and (OURS.match(f"parts/{f.name}") or TMP_SUFFIX.search(f.name)):
                f.unlink()
        with contextlib.suppress(OSError):
            parts.rmdir()
    with contextlib.suppress(FileNotFoundError):
        (work / PLAN_NAME).unlink()
    for f in work.glob(f"{PLAN_NAME}.tmp-*"):
        f.unlink()
    if created:
        with contextlib.suppress(OSError):
            work.rmdir()


def remove_work_url(store: WorkStore) -> None:
    """Delete the objects the build wrote under a work URL: receipts first (a removal cut short leaves no
    receipt without its parts), plan.json last."""
    found = sorted(k for k in store.list() if OURS.match(k) or (k.startswith("parts/") and ".tmp-" in k))
    receipts = [k for k in found if k.startswith("parts/") and k.endswith(".json")]
    store.remove(*receipts)
    store.remove(*sorted(set(found) - set(receipts) - {PLAN_NAME}))
    store.remove(*[k for k in found if k == PLAN_NAME])
