"""The driver: plan, run the tasks without a valid receipt on an executor, commit in plan order.

    from niels_gpt.builders import dist_build
    summary = dist_build(["corpus/"], "cache/pretrain/mine", tokenizer="cache/tokenizer",
                         max_train_tokens=10**9, max_val_tokens=5_000_000, executor="processes", workers=8)

- the work directory (default `<out>.dist-build/`, beside the output, so that an interrupted rebuild
  leaves the old cache exactly as it was) holds plan.json and each task's parts and receipt; it must be
  on a filesystem every worker sees. It is removed after a successful commit unless `keep_parts`;
- resuming: the same command again reuses every task whose receipt is valid (same task id, part files of
  the recorded sizes; their sha256 is checked when the commit reads them) and runs only the others;
- the commit runs while tasks finish, taking their parts in plan order; once both budgets are met it
  stops and the tasks still queued are dropped;
- a task that fails (a bad record, a dead worker) fails the build when the commit reaches it: the error
  names the task, its input range and the record; finished tasks keep their receipts for the rerun;
- a torch shuffle buffer mixes documents across the whole stream, so no plan can cut it: with
  `shuffle_buffer` set the build says so and runs on one process (`build_pretrain_cache`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from niels_gpt.atomic import TMP_SUFFIX, write_bytes_atomic
from niels_gpt.builders.caches import build_pretrain_cache
from niels_gpt.builders.commit import commit
from niels_gpt.builders.executors import RAY_ADDRESS, RETRIES, WorkerDied, make_executor
from niels_gpt.builders.plan import TASK_BYTES, TEXT_FIELD, Plan, make_plan, plan_documents
from niels_gpt.builders.tasks import keep_tokenizer, load_receipt, parts_dir, run_task
from niels_gpt.errors import CacheError, NielsGPTError
from niels_gpt.formats.writers import check_shard_bytes
from niels_gpt.outputs import PLAN_NAME, check_output
from niels_gpt.seeds import check_seed
from niels_gpt.staging import build_aside
from niels_gpt.storage.upload import local_path_of, staged_output
from niels_gpt.tokenizer import load_tokenizer
from niels_gpt.urls import is_url, refuse_url

WORK_DIR_SUFFIX = ".dist-build"  # the default work directory: <out>.dist-build, beside the output
PART_FILE = re.compile(r"^\d{5,}-[0-9a-f]{12}\.(bin|lens\.npy|json|started)$")  # tasks.py's part names


class Progress:
    """Tasks done and tokens/s across every worker; a tqdm bar on a terminal, silent otherwise."""

    def __init__(self, total_tasks: int, reused: int, enabled: bool | None):
        from tqdm.auto import tqdm

        self.t0 = time.perf_counter()
        self.tokens = 0
        self.bar = tqdm(total=total_tasks, initial=reused, unit="task", desc="dist-build",
                        disable=None if enabled else True)

    def task_done(self, receipt: dict) -> None:
        self.tokens += receipt["tokens"]
        rate = self.tokens / max(time.perf_counter() - self.t0, 1e-9)
        self.bar.set_postfix_str(f"{rate / 1e6:.2f} Mtok/s", refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def _ordered_receipts(plan: Plan, reused: dict[int, dict], executor, args: tuple, progress: Progress,
                      counters: dict) -> Iterator[dict]:
    """Receipts in plan order, running the missing tasks `window` at a time on the executor."""
    todo = [t for t in plan.tasks if t.index not in reused]
    window = max(1, executor.window)
    results: dict[int, tuple] = {}
    inflight = 0
    nxt = 0
    for t in plan.tasks:
        if t.index in reused:
            yield reused[t.index]
            continue
        while t.index not in results:
            while nxt < len(todo) and inflight < window:
                executor.submit(todo[nxt].index, run_task, todo[nxt].to_json(), *args)
                nxt += 1
                inflight += 1
            for key, receipt, error in executor.wait():
                inflight -= 1
                results[key] = (receipt, error)
                if error is None:
                    counters["ran"] += 1
                    counters["task_seconds"] += receipt["seconds"]
                    counters["tokenized"] += receipt["tokens"]
                    progress.task_done(receipt)
        receipt, error = results.pop(t.index)
        if error is not None:
            done = counters["ran"] + len(reused)
            hint = (f"; {done} of {len(plan.tasks)} tasks are finished and kept: fix the input and run the same "
                    "command again to resume")
            if isinstance(error, WorkerDied):
                raise CacheError(f"task {t.id} ({t.where()}): {error}{hint}") from error
            if isinstance(error, NielsGPTError):
                raise type(error)(f"task {t.id} ({t.where()}): {error}{hint}") from error
            raise CacheError(f"task {t.id} ({t.where()}) failed: {type(error).__name__}: {error}{hint}") from error
        yield receipt


def tokenizer_ref(tok) -> str:
    """How a task names the tokenizer to open: an absolute path for a file or directory (a Ray worker runs
    in a directory of Ray's choosing), else the name itself (a tiktoken encoding such as cl100k_base)."""
    path = Path(tok.model_path)
    return str(path.resolve()) if path.exists() else tok.model_path


def dist_build(inputs: Sequence[str | os.PathLike], out_dir: str | os.PathLike, *, tokenizer: str | os.PathLike,
               max_train_tokens: int, max_val_tokens: int, shard_bytes: int, seed: int,
               executor: str = "processes", workers: int | None = None, ray_address: str = RAY_ADDRESS,
               retries: int = RETRIES, task_bytes: int = TASK_BYTES, text_field: str = TEXT_FIELD,
               hf: dict | None = None, dataset_name: str | None = None, shuffle_buffer: int | None = None,
               work_dir: str | os.PathLike | None = None, keep_parts: bool = False,
               progress: bool | None = False, log=None, eos: int | str | None = None,
               bos: int | str | None = None, separator: str | None = None) -> dict:
    """Build a pretraining cache from `inputs` on `executor`; returns a summary (also the caller's to print).

    The cache is byte-identical to `build_pretrain_cache(<the inputs' documents in order>, out_dir,
    shuffle_buffer=None, dataset_name=..., source=plan.describe(), streaming=plan.streaming)`,
    whatever the executor, the number of workers or the task size.

    `eos`/`bos`/`separator`: the tokenizer's conventions, as `load_tokenizer` (and `build --eos/--bos/
    --separator`) take them: which token ends every document, or that a BOS starts every document.
    """
    log = log or (lambda msg: print(msg, file=sys.stderr))
    t0 = time.perf_counter()
    check_shard_bytes(shard_bytes, "--shard-bytes")
    check_seed(seed)
    if work_dir is not None:
        refuse_url(work_dir, "--work-dir")
    if is_url(out_dir) and local_path_of(out_dir) is None:
        # the commit runs into a local staging directory that is then uploaded, meta.json last
        # (niels_gpt/storage); tasks' parts stay in the (local or shared) work directory
        with staged_output(out_dir) as local:
            summary = dist_build(inputs, local, tokenizer=tokenizer, max_train_tokens=max_train_tokens,
                                 max_val_tokens=max_val_tokens, shard_bytes=shard_bytes, seed=seed,
                                 executor=executor, workers=workers, ray_address=ray_address, retries=retries,
                                 task_bytes=task_bytes, text_field=text_field, hf=hf, dataset_name=dataset_name,
                                 shuffle_buffer=shuffle_buffer, work_dir=work_dir, keep_parts=keep_parts,
                                 progress=progress, log=log, eos=eos, bos=bos, separator=separator)
        return {**summary, "out": str(out_dir)}
    if local_path_of(out_dir) is not None:
        out_dir = local_path_of(out_dir)
    out = Path(out_dir)
    # Before any work: the output is replaced only when it is one of ours, the work directory is one of
    # ours or new, and neither overlaps an input or the other (niels_gpt/outputs.py).
    work = Path(work_dir) if work_dir is not None else out.parent / (out.name + WORK_DIR_SUFFIX)
    check_output(out, kind="cache", inputs=inputs, others=[("--work-dir", work)])
    work = check_output(work, kind="work", flag="--work-dir", inputs=inputs, others=[("--out", out)])
    tok = load_tokenizer(tokenizer, eos=eos, bos=bos, separator=separator)
    plan = make_plan(inputs, tokenizer=tok, task_bytes=task_bytes, text_field=text_field, hf=hf)
    common = {"tokenizer": tok, "max_train_tokens": max_train_tokens, "max_val_tokens": max_val_tokens,
              "shard_bytes": shard_bytes, "seed": seed, "dataset_name": dataset_name,
              "streaming": plan.streaming, "source": plan.describe()}
    if shuffle_buffer:
        log(f"dist-build: shuffle buffer {shuffle_buffer}: a buffer shuffle mixes documents across the whole "
            "stream, so the stream cannot be cut into independent tasks; building on one process")
        build_pretrain_cache(plan_documents(plan), str(out), shuffle_buffer=shuffle_buffer,
                             num_workers=workers, progress=progress, **common)
        meta = json.loads((out / "meta.json").read_text(encoding="utf-8"))
        tokens = meta["totals"]["train_tokens"] + meta["totals"]["val_tokens"]
        wall = time.perf_counter() - t0
        return {"executor": "one process (shuffle buffer)", "tasks": len(plan.tasks), "ran": 0, "reused": 0,
                "tokens": tokens, "tokenized": tokens, "wall_seconds": wall, "tokens_per_s": tokens / wall,
                "out": str(out), "shards": len(meta["files"])}
    # Absolute paths (check_output resolved it): a Ray worker runs in a directory of Ray's choosing.
    # whether a run of ours made the directory (this one, or the interrupted one this run resumes): only
    # then is it removed at the end; a --work-dir the user made keeps existing
    created = not work.exists() or _previous_plan(work).get("work_dir_created") is True
    work.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(work / PLAN_NAME, (json.dumps({**plan.to_json(), "work_dir_created": created},
                                                     indent=1) + "\n").encode())
    reused = {t.index: r for t in plan.tasks if (r := load_receipt(work, t)) is not None}
    args = (plan.text_field, tokenizer_ref(tok), tok.sha256, str(work), plan.tokenizer_options)
    keep_tokenizer(args[1], tok, plan.tokenizer_options)  # before a pool forks: its workers inherit it
    ex = make_executor(executor, workers=workers, ray_address=ray_address, retries=retries)
    where = ex.describe()
    log(f"dist-build: {len(plan.tasks)} tasks ({len(reused)} with a valid receipt, reused) on {where}; "
        f"work directory {work}")
    counters = {"ran": 0, "task_seconds": 0.0, "tokenized": 0}
    bar = Progress(len(plan.tasks), len(reused), progress)
    # The commit writes a staging directory beside `out` under the output's lock and swaps it in whole
    # (niels_gpt/staging.py): a failed or killed build leaves the old cache as it was and the receipts in
    # the work directory beside it; a second build of the same output is refused naming the holder.
    try:
        with build_aside(out) as stage:
            meta = commit(work, _ordered_receipts(plan, reused, ex, args, bar, counters), stage, final=out,
                          **common)
    finally:
        ex.cancel()
        ex.close()
        bar.close()
    wall = time.perf_counter() - t0
    tokens = meta["totals"]["train_tokens"] + meta["totals"]["val_tokens"]
    if not keep_parts:
        remove_work(work, created=created)
    return {"executor": where, "tasks": len(plan.tasks), "ran": counters["ran"], "reused": len(reused),
            "tokens": tokens, "tokenized": counters["tokenized"], "task_seconds": counters["task_seconds"],
            "wall_seconds": wall, "tokens_per_s": tokens / wall, "out": str(out),
            "shards": len(meta["files"])}


def _previous_plan(work: Path) -> dict:
    try:
        doc = json.loads((work / PLAN_NAME).read_text("utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def remove_work(work: Path, *, created: bool) -> None:
    """Delete what the driver wrote in the work directory (plan.json, the tasks' parts and receipts, the
    temporaries of killed tasks), then the directories themselves if the driver created them and they are
    empty: a --work-dir the user gave keeps everything else it holds."""
    parts = parts_dir(work)
    if parts.is_dir():
        for f in parts.iterdir():
            if f.is_file() and (PART_FILE.match(f.name) or TMP_SUFFIX.search(f.name)):
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


def format_summary(s: dict) -> str:
    lines = [f"dist-build: {s['tokens']:,} tokens in {s['shards']} shard(s) -> {s['out']}",
             f"  executor {s['executor']}: {s['tasks']} tasks, {s['ran']} ran, {s['reused']} reused from receipts",
             f"  {s['wall_seconds']:.2f} s wall, {s['tokens_per_s'] / 1e6:.2f} Mtok/s (cache tokens / wall)"]
    if s.get("task_seconds"):
        lines.append(f"  tasks: {s['tokenized']:,} tokens tokenized in {s['task_seconds']:.2f} task-seconds "
                     f"({s['tokenized'] / s['task_seconds'] / 1e6:.2f} Mtok/s per worker)")
    return "\n".join(lines)
