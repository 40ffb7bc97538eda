"""`build`: one verb for every scale. Plan the inputs, read the plan on an executor, write the cache.

    from niels_gpt.builders.run import BuildSpec, build
    summary = build(BuildSpec(sources=["data/"], out="cache/mine", tokenizer="tok/", executor="processes"))

- One plan (builders/plan.py) for every executor. `inline` reads it in this process; `processes` and `ray`
  run its tasks on a pool or cluster, then commit their parts in plan order (builders/commit.py). `auto`:
  `processes` with several tasks and workers, else `inline`. The cache is byte-identical either way.
- A parallel build's work directory (default `<out>.build`; a URL lets nodes without a shared disk share it)
  holds plan.json and each task's parts and receipt; a rerun reuses every valid receipt. It is removed after
  the commit unless `keep_parts`.
- A shuffle buffer mixes the whole stream, so it runs inline. A dataset id is shuffled by `datasets`
  (meta.json's `source.shuffle`), other inputs by the builder's seeded torch buffer.
- The output guard (niels_gpt/output_guard.py) judges the output first; every local input read must be as
  planned before the commit marker is written.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from niels_gpt import allocator
from niels_gpt.builders.common import summarize
from niels_gpt.builders.executors import RAY_ADDRESS, RETRIES
from niels_gpt.builders.origins import InputIndex, input_table
from niels_gpt.builders.parallel import run_parallel
from niels_gpt.builders.plan import make_plan, shuffled_by_datasets, shuffled_datasets, shuffled_record
from niels_gpt.builders.pretrain import SplitTexts, build_pretrain_cache
from niels_gpt.builders.sft import build_sft_cache
from niels_gpt.constants import SEED, SHARD_BYTES
from niels_gpt.errors import ConfigError
from niels_gpt.formats.writers import check_shard_bytes
from niels_gpt.formats.zstd_shard import CODECS
from niels_gpt.output_guard import check_output
from niels_gpt.seeds import check_seed
from niels_gpt.sources.documents import Rules, check_layout, record_hook
from niels_gpt.sources.lines import hash_ahead
from niels_gpt.sources.records import hub_shuffle
from niels_gpt.sources.stream import Plan, check_unchanged, task_items
from niels_gpt.storage.fs import filesystem, scheme_of
from niels_gpt.storage.upload import local_path_of, staged_output
from niels_gpt.tokenizer import load_tokenizer
from niels_gpt.tokenizer.find import recorded_path
from niels_gpt.urls import is_url

ALL_TOKENS = 2**62  # no budget: every document
EXECUTORS = ("auto", "inline", "processes", "ray")
WORK_DIR_SUFFIX = ".build"  # the default work directory: <out>.build, beside the output
ON_BAD_RECORD = ("error", "skip")


@dataclass(kw_only=True)
class BuildSpec:
    """What a build is asked for: the flags of `build`, with their one set of defaults."""

    sources: list
    out: str
    tokenizer: object  # a path or name, or a loaded tokenizer
    eos: int | str | None = None
    bos: int | str | None = None
    separator: str | None = None
    chat_template: str | None = None  # --chat-template: a jinja2 file for a sentencepiece model of its own
    chat: bool = False
    layout: str | None = None  # --format; None: detected per input
    read_as: dict = field(default_factory=dict)  # --read-as: suffix -> kind, for files of other suffixes
    text_field: str = "text"
    messages_field: str = "messages"
    chat_columns: tuple[str, str] | None = None
    on_bad_record: str = "error"
    map: str | None = None  # --map module:function, run on every document or conversation
    min_chars: int = 0  # --min-chars N
    val_per_input: bool = False  # --val-per-input: --val-frac draws pieces of each document (inputs.val_pieces)
    hf_config: str | None = None
    split: str = "train"
    max_tokens: int = ALL_TOKENS
    val_tokens: int | None = None  # None: no val split (0 tokens)
    val_frac: float | None = None
    shard_bytes: int = SHARD_BYTES
    seed: int = SEED
    shuffle_buffer: int | None = None
    compress: str | None = None  # "zstd": shards as zstd frames with a frame index (formats/zstd_shard.py)
    executor: str = "auto"
    workers: int | None = None  # None: one per core
    ray_address: str = RAY_ADDRESS
    retries: int = RETRIES
    task_bytes: int | None = None  # None: about 64 tasks of 4-64 MiB (sources/stream.py::auto_task_bytes)
    name: str | None = None
    work_dir: str | None = None
    keep_parts: bool = False
    progress: bool | None = False
    # a cache split by its inputs (build-all's wikitext, roam, gutenberg): `sources` are train, these val, each
    # whole (no budgets), read at `val_split` where they are dataset ids; [] an empty val split
    val_sources: list | None = None
    val_split: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def rules(self) -> Rules:
        return Rules(self.text_field, self.messages_field, tuple(self.chat_columns) if self.chat_columns else None,
                     self.on_bad_record, self.map, self.min_chars, self.val_per_input)

    def loaded_tokenizer(self):
        """The tokenizer, loaded with the spec's conventions when given as a path or name."""
        if isinstance(self.tokenizer, (str, os.PathLike)):
            return load_tokenizer(self.tokenizer, eos=self.eos, bos=self.bos, separator=self.separator,
                                  chat_template=self.chat_template)
        return self.tokenizer


def check_spec(spec: BuildSpec) -> None:
    """Every setting checked before any work, each refusal naming its flag."""
    if spec.on_bad_record not in ON_BAD_RECORD:
        raise ConfigError(f"--on-bad-record {spec.on_bad_record!r}: use one of {', '.join(ON_BAD_RECORD)}")
    if spec.executor not in EXECUTORS + ("inprocess",):
        raise ConfigError(f"--executor {spec.executor!r}: use one of {', '.join(EXECUTORS)}")
    if spec.chat_columns is not None and (len(spec.chat_columns) != 2 or not all(spec.chat_columns)):
        raise ConfigError(f"--chat-columns takes USER_COL,ASSISTANT_COL, got {spec.chat_columns!r}")
    if spec.layout is not None:
        check_layout(spec.layout, spec.chat)
    if spec.min_chars < 0:
        raise ConfigError(f"--min-chars {spec.min_chars}: must be >= 0 (0: keep every document)")
    if spec.map is not None:
        record_hook(spec.map)  # importable here, before any work
    if spec.workers is not None and spec.workers < 1:
        raise ConfigError(f"--workers {spec.workers}: must be >= 1 (0 on the command line: one per core)")
    if spec.task_bytes is not None and spec.task_bytes < 1:
        raise ConfigError(f"--task-bytes {spec.task_bytes}: must be >= 1")
    check_seed(spec.seed, "--seed")
    if spec.val_per_input and (spec.chat or spec.val_frac is None):
        raise ConfigError("--val-per-input cuts documents into pieces for --val-frac to draw from each input; "
                          + ("an SFT cache (--chat) is split by conversation: drop --val-per-input" if spec.chat else
                             "give --val-frac F with it"))
    if spec.val_sources is not None:
        given = [flag for flag, on in (("--chat", spec.chat), ("--val-tokens", spec.val_tokens is not None),
                                       ("--val-frac", spec.val_frac is not None),
                                       ("--max-tokens", spec.max_tokens != ALL_TOKENS)) if on]
        if given:
            raise ConfigError(f"{', '.join(given)}: a cache whose val split is its own inputs (val_sources) is built "
                              "whole from them; leave these out")
    if spec.chat:
        unused = [flag for flag, given in (("--val-tokens", spec.val_tokens is not None),
                                            ("--max-tokens", spec.max_tokens != ALL_TOKENS),
                                            ("--shuffle-buffer", bool(spec.shuffle_buffer)),
                                            ("--shard-bytes", spec.shard_bytes != SHARD_BYTES),
                                            ("--compress", spec.compress is not None)) if given]
        if unused:
            raise ConfigError(f"{', '.join(unused)} apply to pretraining caches; an SFT cache (--chat) keeps every "
                              "example in stream order and is split by example with --val-frac")
        if spec.val_frac is not None and not 0.0 <= spec.val_frac < 1.0:
            raise ConfigError(f"--val-frac must be in [0, 1), got {spec.val_frac}")
        return
    check_shard_bytes(spec.shard_bytes, "--shard-bytes")
    if spec.compress is not None and spec.compress not in CODECS:
        raise ConfigError(f"--compress {spec.compress!r}: use one of {', '.join(CODECS)} (or leave it out: uncompressed)")
    if spec.val_tokens is not None and spec.val_frac is not None:
        raise ConfigError("give --val-tokens or --val-frac, not both")
    if spec.val_frac is not None and not 0.0 < spec.val_frac < 1.0:
        raise ConfigError(f"--val-frac must be in (0, 1), got {spec.val_frac}")
    for flag, value in (("--max-tokens", spec.max_tokens), ("--val-tokens", spec.val_tokens)):
        if value is not None and value < 0:
            raise ConfigError(f"{flag} {value}: must be >= 0")
    if spec.max_tokens == 0 and val_budget(spec) == 0:
        raise ConfigError(f"--max-tokens 0 {'and --val-tokens 0' if spec.val_tokens == 0 else 'and no val split'}: "
                          "nothing would be built; give --max-tokens a positive budget (or leave it out: all), or "
                          "--val-tokens N / --val-frac F for a val split")


def check_renders_chats(tok) -> None:
    """Before any work: a chat build needs the library's chat tokens or a chat template."""
    if not getattr(tok, "library_conventions", True) and getattr(tok, "chat_template", None) is None:
        raise ConfigError(f"{tok.model_path}: --chat needs a chat template, and this tokenizer has none (nor the "
                          "library's four chat tokens); pass --chat-template FILE (a jinja2 template), or put a "
                          "tokenizer_config.json with a chat_template beside the model")


def val_budget(spec: BuildSpec) -> int:
    """The val token budget: --val-tokens, all of val's share with --val-frac, else none."""
    if spec.val_tokens is not None:
        return spec.val_tokens
    return ALL_TOKENS if spec.val_frac is not None else 0


def work_dir_of(spec: BuildSpec, out: Path) -> Path | str:
    """The work directory: a local Path, or the URL (str) of a prefix in an object store (storage/work.py)."""
    if spec.work_dir is None:
        return out.parent / (out.name + WORK_DIR_SUFFIX)
    local = local_path_of(spec.work_dir)
    if local is None:
        filesystem(str(spec.work_dir), write=True)  # an unknown or read-only scheme: refused here, in one line
        return str(spec.work_dir).rstrip("/")
    return Path(local)


@allocator.keeping
def build(spec: BuildSpec, log: Callable[[str], None] | None = None) -> dict:
    """Build the cache `spec` asks for; returns a summary (format_summary prints it)."""
    log = log or (lambda msg: print(msg, file=sys.stderr))
    check_spec(spec)
    if is_url(spec.out) and local_path_of(spec.out) is None:
        # staged locally, then uploaded with meta.json last; the work directory: --work-dir, else <out>.build
        # in the same store (memory:// is this process's own: then a local directory beside the staged output)
        work = spec.work_dir
        if work is None and scheme_of(str(spec.out)) != "memory":
            work = str(spec.out).rstrip("/") + WORK_DIR_SUFFIX
        if work is not None and is_url(work):
            _apart(str(spec.out).rstrip("/"), str(work).rstrip("/"))
        with staged_output(spec.out, guard=True) as local:
            summary = build(replace(spec, out=str(local), work_dir=work,
                                    extra={**spec.extra, "out_url": str(spec.out).rstrip("/")}), log)
        return {**summary, "out": str(spec.out)}
    t0 = time.perf_counter()
    out = Path(local_path_of(spec.out))
    work = work_dir_of(spec, out)
    inputs = [*spec.sources, *(spec.val_sources or [])]
    check_output(out, kind="cache", inputs=inputs, others=[("--work-dir", work)] if isinstance(work, Path) else [])
    tok = spec.loaded_tokenizer()
    if spec.chat:
        check_renders_chats(tok)
    shuffle = (spec.seed, spec.shuffle_buffer) if spec.shuffle_buffer and spec.shuffle_buffer > 1 else None
    kw = dict(tokenizer=tok, task_bytes=spec.task_bytes, rules=spec.rules, layout=spec.layout,
              config=spec.hf_config, read_as=spec.read_as, shuffle=shuffle)
    plan = make_plan(spec.sources, chat=spec.chat, split=spec.split, **kw)
    val = make_plan(spec.val_sources, split=spec.val_split or spec.split, **kw) if spec.val_sources else None
    executor = choose_executor(spec, plan, log)
    if shuffled_by_datasets(spec.shuffle_buffer, plan, val):
        spec = replace(spec, shuffle_buffer=None)  # datasets shuffled the stream: no torch buffer on top
    if spec.val_sources is not None or executor == "inline":
        summary = _inline(spec, plan, val, tok, out)
    else:
        summary = run_parallel(spec, plan, tok, out, executor=executor, log=log, work=work,
                               workers=workers_of(spec) if spec.workers or executor != "ray" else None,
                               val_budget=val_budget(spec))
    wall = time.perf_counter() - t0
    return {**summary, "wall_seconds": wall, "tokens_per_s": summary["tokens"] / max(wall, 1e-9), "out": str(out)}


def _apart(out: str, work: str) -> None:
    """--out and --work-dir URLs must not overlap: the commit would upload the parts, the cleanup delete the cache."""
    for a, b in ((out, work), (work, out)):
        if a == b or a.startswith(b + "/"):
            raise ConfigError(f"--work-dir {work} {'is' if a == b else 'overlaps'} --out {out}; the two outputs of "
                              f"one command must not overlap: choose separate prefixes, e.g. --work-dir {out}.build")


def workers_of(spec: BuildSpec) -> int:
    return spec.workers or os.cpu_count() or 1


def choose_executor(spec: BuildSpec, plan: Plan, log) -> str:
    if spec.shuffle_buffer and spec.executor not in ("auto", "inline"):
        log(f"build: shuffle buffer {spec.shuffle_buffer}: a buffer shuffle mixes documents across the whole stream, "
            "so the stream cannot be cut into independent tasks; building inline, in this process")
        return "inline"
    if spec.executor != "auto":
        return spec.executor
    if spec.shuffle_buffer or len(plan.tasks) < 2 or workers_of(spec) < 2:
        return "inline"
    return "processes"


class _Reader:
    """The plan's items in order, for the inline builders; remembers which local inputs it opened. `offset`:
    where its inputs start in the cache's input table (a val split's plan after train's); no plan: no items."""

    def __init__(self, plan: Plan | None, offset: int = 0):
        self.plan = plan
        self.offset = offset
        self.read: list[str] = []
        self.stop = threading.Event()  # set: the hashing below stops (the build failed)
        self.hashing = None
        # the input table's sha256 of each local input that is not hashed as it is read (as JSON Lines ranges
        # are), made meanwhile on a thread of its own: not after the build, on its last step
        ahead = [name for name, kind in zip(plan.inputs, plan.kinds, strict=False)  # (no kinds: none ahead)
                 if kind not in (".jsonl", ".json", "dataset") and "://" not in name] if plan is not None else []
        if ahead:
            self.hashing = threading.Thread(target=hash_ahead, args=(ahead, self.stop), name="input-sha256",
                                            daemon=True)
            self.hashing.start()

    def __iter__(self):
        return (item for item, _ in self._items(origins=False))

    def with_origins(self):
        """(item, origin) pairs: the origin a row of the cache's origins (builders/origins.py), None for a
        Skipped."""
        return self._items(origins=True)

    def _items(self, origins: bool):
        if self.plan is None:
            return
        index = InputIndex(self.plan.inputs, self.offset)
        for t in self.plan.tasks:
            self.read += [p["item"] for p in t.pieces if p["item"] in self.plan.signatures]
            if not origins:
                yield from ((item, None) for item in task_items(t, self.plan.rules, self.plan.signatures))
                continue
            for item, origin in task_items(t, self.plan.rules, self.plan.signatures, origins=True):
                yield item, None if origin is None else index.row(t.pieces, origin)

    def origin_table(self) -> list[dict]:
        if self.plan is None:
            return []
        if self.hashing is not None:
            self.hashing.join()
        table = input_table(self.plan.inputs, self.plan.kinds, self.plan.config, self.plan.split)
        shuffled = {p["item"]: p for p in shuffled_datasets(self.plan)}
        for name, entry in zip(self.plan.inputs, table, strict=True):
            if name in shuffled:  # one piece, the whole stream: the record is the row's place in it
                entry["record"] = shuffled_record(shuffled[name])
        return table

    def described(self) -> dict:
        """meta.json's `source`, once the builder has read what it needed: first, every input it read
        must be as it was when the build planned it."""
        if self.plan is None:
            return {}
        check_unchanged(self.plan, sorted(set(self.read)))
        shuffled = shuffled_datasets(self.plan)
        return {**self.plan.describe(), **({"shuffle": hub_shuffle(shuffled[0]["shuffle_seed"],
                                                                    shuffled[0]["shuffle_buffer"])} if shuffled else {})}


def _inline(spec: BuildSpec, plan: Plan, val: Plan | None, tok, out: Path) -> dict:
    """The build in this process. With `val_sources` (a cache split by its inputs): the train plan's documents
    all go to train, the val plan's to val, without budgets."""
    reader = _Reader(plan)
    split = spec.val_sources is not None
    texts, described = reader, reader.described
    if split:
        texts = SplitTexts(train=reader, val=_Reader(val, offset=len(plan.inputs)))

        def described() -> dict:
            about = reader.described()
            rule = spec.extra.get("split_rule", "the sources are train, val_sources val")
            return {**about, "split_rule": rule, "val_files": texts.val.described().get("files", []),
                    **({"val_split": spec.val_split} if spec.val_split else {}),
                    **({"skipped_inputs": spec.extra["skipped_inputs"] + about.get("skipped_inputs", [])}
                       if spec.extra.get("skipped_inputs") else {})}

    try:  # the readers' input hashing stops however this ends
        common = dict(tokenizer=tok, seed=spec.seed, dataset_name=spec.name or out.name,
                      dataset_config=spec.hf_config, streaming=plan.streaming, source=described,
                      progress=spec.progress, tokenizer_path=recorded_path(tok, out), num_workers=spec.workers)
        if spec.chat:
            build_sft_cache(reader, str(out), val_frac=spec.val_frac or 0.0, on_bad_record=spec.on_bad_record,
                            **common)
        else:
            sizes = (plan.input_bytes(), val.input_bytes() if val is not None else 0)
            build_pretrain_cache(texts, str(out), max_train_tokens=ALL_TOKENS if split else spec.max_tokens,
                                 max_val_tokens=ALL_TOKENS if split else val_budget(spec),
                                 shard_bytes=spec.shard_bytes, shuffle_buffer=spec.shuffle_buffer,
                                 input_bytes=None if None in sizes else sum(sizes), val_frac=spec.val_frac,
                                 compress=spec.compress, **common)
    finally:
        for r in (reader, getattr(texts, "val", None)):
            if r is not None:
                r.stop.set()
    tasks = len(plan.tasks) + (len(val.tasks) if val is not None else 0)
    workers = f" ({spec.workers} encode workers)" if spec.workers and not split else ""
    return summarize(out, executor="inline" + workers, tasks=tasks, ran=tasks, reused=0)


def format_summary(s: dict) -> str:
    totals = ", ".join(f"{k} {v:,}" for k, v in sorted(s["totals"].items()))
    lines = [f"built {s['kind']} cache {s['out']}: {totals}" + (f"; skipped {s['skipped']}" if s["skipped"] else ""),
             f"  executor {s['executor']}: {s['tasks']} task(s), {s['ran']} ran, {s['reused']} reused from receipts; "
             f"{s['files']} file(s)",
             f"  {s['wall_seconds']:.2f} s wall, {s['tokens_per_s'] / 1e6:.2f} Mtok/s (cache tokens / wall)"]
    if left_out := s.get("skipped_inputs"):  # the files under the sources that were not read, and why
        named = "; ".join(f"{d['path']} ({d['reason']})" for d in left_out[:3])
        more = f"; and {len(left_out) - 3} more (meta.json's skipped_inputs)" if len(left_out) > 3 else ""
        lines.append(f"  left out {len(left_out)} file(s) under the sources: {named}{more}")
    if s.get("task_seconds"):
        lines.append(f"  tasks: {s['tokenized']:,} tokens in {s['task_seconds']:.2f} task-seconds "
                     f"({s['tokenized'] / s['task_seconds'] / 1e6:.2f} Mtok/s per worker)")
    return "\n".join(lines)
