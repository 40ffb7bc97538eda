"""build-all: the tokenizer (trained, or copied from --tokenizer), then every pretraining and SFT cache of the
contract, each one `BuildSpec` (`recipe(name)`, from sources/named.py) run inline by `build`.

Each cache commits on its own, so a failure part-way leaves every finished cache usable. `sample=True` points
every source at the bundled sample corpus; `--only tokenizer NAME...` trains the tokenizer on those alone.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from niels_gpt.atomic import atomic_path
from niels_gpt.builders.plan import make_plan
from niels_gpt.builders.pretrain import MAX_TRAIN_TOKENS, MAX_VAL_TOKENS
from niels_gpt.builders.run import ALL_TOKENS, BuildSpec, build, check_spec
from niels_gpt.builders.sft import VAL_FRAC
from niels_gpt.constants import META_NAME, SEED, SHARD_BYTES
from niels_gpt.errors import ConfigError, NielsGPTError, TokenizerError
from niels_gpt.formats.writers import check_shard_bytes
from niels_gpt.meta import read_meta, write_meta
from niels_gpt.output_guard import check_overlap
from niels_gpt.seeds import check_seed
from niels_gpt.sources.documents import Rules
from niels_gpt.sources.named import NAMED, OPTIONS, inputs, values_of
from niels_gpt.sources.stream import stream_items
from niels_gpt.staging import build_aside
from niels_gpt.storage.upload import staged_output
from niels_gpt.tokenizer import MODEL_NAME, SPECIAL_TOKENS, TrainSettings, load_tokenizer, train_tokenizer
from niels_gpt.tokenizer.spm import check_train_settings
from niels_gpt.urls import is_url, refuse_url

PRETRAIN = tuple(name for name, n in NAMED.items() if n.kind == "pretrain")
SFT = tuple(name for name, n in NAMED.items() if n.kind == "sft")
ALL = ("tokenizer",) + PRETRAIN + SFT
SAMPLE_MAX_VAL_TOKENS = 4096  # fineweb_edu's val budget on the sample corpus (a few pages, not all of it)


@dataclass(kw_only=True)
class BuildConfig:
    """A build-all run: output, seed, tokenizer, budgets, and each named source's options (sources/named.py:
    `options={"<source>_dir": "notes/"}`; an option left out has its default)."""

    cache_dir: str = "cache"
    seed: int = SEED
    only: tuple[str, ...] = ALL
    sample: bool = False
    tokenizer: str | None = None  # copy this model instead of training one
    replace_tokenizer: bool = False  # allow a new tokenizer although caches not rebuilt now used the old one
    tokenizer_settings: TrainSettings = field(default_factory=TrainSettings)
    workers: int | None = None
    max_train_tokens: int = MAX_TRAIN_TOKENS  # fineweb_edu's budgets (the sources cached whole have none)
    max_val_tokens: int | None = None  # None: MAX_VAL_TOKENS, or SAMPLE_MAX_VAL_TOKENS with sample
    shard_bytes: int = SHARD_BYTES
    shuffle_buffer: int | None = None
    val_frac: float = VAL_FRAC  # SFT caches' val share
    progress: bool | None = None
    options: dict = field(default_factory=dict)

    def resolved_max_val_tokens(self) -> int:
        if self.max_val_tokens is not None:
            return self.max_val_tokens
        return SAMPLE_MAX_VAL_TOKENS if self.sample else MAX_VAL_TOKENS


def trained_on_sources(cfg: BuildConfig) -> tuple[str, ...]:
    """The sources the tokenizer trains on: with `--only tokenizer NAME...` those alone, else all of them."""
    named = tuple(n for n in PRETRAIN + SFT if n in cfg.only)
    return named if "tokenizer" in cfg.only and named else PRETRAIN + SFT


def _texts(fields: dict) -> Iterator[str]:
    """The documents of a named source's train inputs, or every message of its conversations."""
    chat = fields.get("chat", False)
    plan = make_plan(fields["sources"], tokenizer=None, rules=Rules(), chat=chat, layout=fields["layout"],
                     config=fields.get("hf_config"), split=fields.get("split", "train"))
    for item in stream_items(plan, check_at_end=False):
        if isinstance(item, str):
            yield item
        elif isinstance(item, list):
            yield from (m["content"] for m in item)


def tokenizer_texts(cfg: BuildConfig) -> Iterator[str]:
    """The tokenizer's training text, read as `build` reads it: the train documents of every pretraining
    source and the messages of every SFT source, interleaved source by source."""
    streams = []
    for name in trained_on_sources(cfg):
        try:
            fields = inputs(name, cfg.options, cfg.seed, cfg.sample)
        except ConfigError:
            continue  # a source that is not configured simply does not contribute
        if fields is not None:
            streams.append(_texts(fields))
    for group in itertools.zip_longest(*streams):
        yield from (t for t in group if t is not None)


def build_tokenizer(cfg: BuildConfig) -> dict:
    """Train (or copy) the tokenizer aside and swap it in: a failed or refused step leaves the old one."""
    refuse_url(cfg.cache_dir, "--cache-dir")
    out = Path(cfg.cache_dir) / "tokenizer"
    with build_aside(out, kind="tokenizer", flag="tokenizer output") as stage:
        if cfg.tokenizer:
            src = Path(cfg.tokenizer)
            tok = load_tokenizer(src)
            if not tok.library_conventions:
                raise TokenizerError(f"{src}: build-all's caches use the library's four chat tokens (special token "
                                     f"{SPECIAL_TOKENS['eot']!r} and the three role sentinels), which this tokenizer "
                                     "lacks; add them with niels_gpt.tokenizer.hf.add_special_tokens_to, or build "
                                     "with build_pretrain_cache / build_sft_cache, which keep the tokenizer's own "
                                     "conventions")
            # a tokenizer.json stays a tokenizer.json: load_tokenizer opens a directory by its file name
            name = "tokenizer.json" if Path(tok.model_path).suffix == ".json" else MODEL_NAME
            with atomic_path(stage / name) as tmp:
                shutil.copyfile(tok.model_path, tmp)
            tok = load_tokenizer(stage / name)
            write_meta(str(stage), {"kind": "tokenizer", "format_version": 1, "model_file": name,
                                    "tokenizer_sha256": tok.sha256, "vocab_size": len(tok),
                                    "special_token_ids": dict(tok.special_ids), "bos_id": tok.bos_id,
                                    "settings": None, "trained_on": f"copied from {src}"})
        else:
            trained_on = {"sources": list(trained_on_sources(cfg)),
                          "sample_corpus": cfg.sample,
                          "rule": "training splits of sources with their own split; every message of SFT sources"}
            tok = train_tokenizer(tokenizer_texts(cfg), stage, settings=cfg.tokenizer_settings,
                                  trained_on=trained_on)
        refuse_orphaning(cfg, tok.sha256)
    tok = load_tokenizer(out)
    return {"name": "tokenizer", "kind": "tokenizer", "vocab_size": len(tok), "sha256": tok.sha256[:16]}


def refuse_orphaning(cfg: BuildConfig, sha256: str) -> None:
    """Caches in cache_dir that this run does not rebuild must have been built with this tokenizer."""
    if cfg.replace_tokenizer:
        return
    root = Path(cfg.cache_dir)
    stale = []
    for meta_file in sorted([*root.glob("pretrain/*/meta.json"), *root.glob("sft/*/meta.json")]):
        name = meta_file.parent.name
        try:
            meta = read_meta(str(meta_file.parent))
        except NielsGPTError:
            continue
        if meta.get("built", True) and name not in cfg.only and meta.get("tokenizer_sha256") != sha256:
            stale.append(f"{meta_file.parent.relative_to(root)}")
    if stale:
        raise ConfigError(f"{root / 'tokenizer'}: the new tokenizer (sha256 {sha256[:16]}…) differs from the one "
                          f"these caches were built with: {', '.join(stale)}; rebuild them in the same run "
                          "(--only tokenizer NAME...) or pass --replace-tokenizer to replace it anyway")


def recipe(name: str, cfg: BuildConfig, tokenizer) -> BuildSpec | None:
    """The `build` of build-all's cache `name`; None for a source with nothing to read (gutenberg without a
    directory)."""
    fields = inputs(name, cfg.options, cfg.seed, cfg.sample)
    if fields is None:
        return None
    sft = name in SFT
    own = fields.get("val_sources") is not None  # cached whole in its own splits: no budgets
    shuffle = None if sft else cfg.shuffle_buffer or fields.pop("shuffle_buffer", None)
    fields.pop("shuffle_buffer", None)
    return BuildSpec(**fields, out=str(Path(cfg.cache_dir) / ("sft" if sft else "pretrain") / name),
                     tokenizer=tokenizer, name=name, seed=cfg.seed, workers=cfg.workers, executor="inline",
                     progress=cfg.progress, shard_bytes=SHARD_BYTES if sft else cfg.shard_bytes,
                     shuffle_buffer=shuffle, val_frac=cfg.val_frac if sft else None,
                     max_tokens=ALL_TOKENS if sft or own else cfg.max_train_tokens,
                     val_tokens=None if sft or own else cfg.resolved_max_val_tokens())


def build_one(name: str, cfg: BuildConfig, tokenizer) -> dict:
    spec = recipe(name, cfg, tokenizer)
    if spec is not None:
        s = build(spec, log=lambda msg: None)
        return {"name": name, "kind": s["kind"], "built": True, **s["totals"],
                **{k: s[k] for k in ("files", "skipped", "skipped_inputs")}}
    out = Path(cfg.cache_dir) / "pretrain" / name  # a placeholder, not a failure: "built": false says why
    flags = " or ".join(OPTIONS[f].flag for f in NAMED[name].local)
    with build_aside(out) as stage:
        for split in ("train", "val"):
            (stage / split).mkdir()
        write_meta(str(stage), {"kind": "pretrain", "built": False, "dataset_name": name,
                                "reason": f"no {flags} given", "seed": cfg.seed})
    return {"name": name, "kind": "pretrain", "built": False}


def local_inputs(cfg: BuildConfig) -> list[str]:
    """The user's own files and directories that this run's sources read (their `local` options)."""
    found: list[str] = []

    def add(value) -> None:
        if isinstance(value, (str, os.PathLike)):
            found.append(os.fspath(value))
        elif isinstance(value, dict):
            for v in value.values():
                add(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                add(v)

    for name in cfg.only:
        if name in NAMED:
            values = values_of(name, cfg.options, False)
            for field_name in NAMED[name].local:
                add(values[field_name])
    return found


def check_outputs(cfg: BuildConfig) -> None:
    """Before any work: no output of this run may be, hold or sit inside an input."""
    root = Path(cfg.cache_dir)
    inputs = local_inputs(cfg)
    if cfg.tokenizer:
        inputs.append(cfg.tokenizer)
    outs = [root / "tokenizer"] if "tokenizer" in cfg.only else []
    outs += [root / ("sft" if name in SFT else "pretrain") / name for name in PRETRAIN + SFT if name in cfg.only]
    for out in outs:
        check_overlap(Path(out).resolve(), [i for i in inputs if not (out.name == "tokenizer" and i == cfg.tokenizer)],
                      "--cache-dir")


def check_config(cfg: BuildConfig) -> None:
    """Every flag of a build-all run, and each cache's recipe, checked before anything is built."""
    check_seed(cfg.seed)
    check_shard_bytes(cfg.shard_bytes, "--shard-bytes")
    for flag, value in (("--max-tokens", cfg.max_train_tokens), ("--val-tokens", cfg.max_val_tokens)):
        if value is not None and value < 0:
            raise ConfigError(f"{flag} {value}: a token budget must be >= 0 (leave it out: all)")
    if not 0.0 <= cfg.val_frac < 1.0:
        raise ConfigError(f"--val-frac {cfg.val_frac}: val_frac must be in [0, 1) (the SFT caches' val share)")
    unknown = sorted(set(cfg.only) - set(ALL))
    if unknown:
        raise ConfigError(f"--only: unknown name(s) {', '.join(unknown)}; choose from {' '.join(ALL)}")
    if cfg.workers is not None and cfg.workers < 1:
        raise ConfigError(f"--workers {cfg.workers}: must be >= 1 (leave it out: one per core)")
    if cfg.shuffle_buffer is not None and cfg.shuffle_buffer < 0:
        raise ConfigError(f"--shuffle-buffer {cfg.shuffle_buffer}: must be >= 0 (0 or none: off)")
    if not cfg.tokenizer and ("tokenizer" in cfg.only or not (Path(cfg.cache_dir) / "tokenizer" / META_NAME).is_file()):
        check_train_settings(cfg.tokenizer_settings)
    for name in PRETRAIN + SFT:
        spec = recipe(name, cfg, None) if name in cfg.only else None
        if spec is not None and not spec.chat and spec.max_tokens == 0 and spec.val_tokens == 0:
            raise ConfigError(f"--max-tokens 0 and --val-tokens 0 (both 0): the {name} cache would be empty; give "
                              "either a positive budget (or leave them out)")
        if spec is not None:
            check_spec(spec)
    check_outputs(cfg)


def build_all(cfg: BuildConfig, log=print) -> list[dict]:
    if is_url(cfg.cache_dir) and not cfg.cache_dir.startswith("file://"):
        # built locally, then uploaded, every meta.json last; a tokenizer at the URL is fetched first
        with staged_output(cfg.cache_dir, prefetch=("tokenizer",)) as local:
            rows = build_all(dataclasses.replace(cfg, cache_dir=str(local)), log)
        log(f"uploaded to {cfg.cache_dir}")
        return rows
    if cfg.cache_dir.startswith("file://"):
        cfg = dataclasses.replace(cfg, cache_dir=cfg.cache_dir[len("file://"):])
    check_config(cfg)
    rows = []
    tok_dir = Path(cfg.cache_dir) / "tokenizer"
    if cfg.tokenizer or "tokenizer" in cfg.only or not (tok_dir / META_NAME).is_file():
        t0 = time.perf_counter()
        rows.append({**build_tokenizer(cfg), "seconds": time.perf_counter() - t0})
        log(f"tokenizer: {rows[-1]['vocab_size']} ids -> {tok_dir}")
    read_meta(str(tok_dir))
    tokenizer = load_tokenizer(tok_dir)
    for name in PRETRAIN + SFT:
        if name not in cfg.only:
            continue
        t0 = time.perf_counter()
        row = build_one(name, cfg, tokenizer)
        row["seconds"] = time.perf_counter() - t0
        rows.append(row)
        log(f"{name}: done in {row['seconds']:.1f}s")
    return rows


def format_summary(rows: list[dict]) -> str:
    head = f"{'cache':<12} {'kind':<9} {'train':>13} {'val':>11} {'files':>5} {'seconds':>8} {'tok/s':>10}"
    lines = [head, "-" * len(head)]
    for r in rows:
        if r["kind"] == "tokenizer":
            lines.append(f"{r['name']:<12} {'tokenizer':<9} {r['vocab_size']:>10} ids {'':>11} {'':>5} "
                         f"{r['seconds']:>8.1f}")
            continue
        if not r.get("built", True):
            lines.append(f"{r['name']:<12} {r['kind']:<9} {'not built':>13}")
            continue
        unit = "tok" if r["kind"] == "pretrain" else "ex"
        train = r.get("train_tokens") if unit == "tok" else r.get("train_examples")
        val = r.get("val_tokens") if unit == "tok" else r.get("val_examples")
        toks = r.get("train_tokens", 0) + r.get("val_tokens", 0)
        rate = toks / r["seconds"] if r["seconds"] > 0 else float("inf")
        lines.append(f"{r['name']:<12} {r['kind']:<9} {train:>10} {unit:<2} {val:>8} {unit:<2} {r['files']:>5} "
                     f"{r['seconds']:>8.1f} {rate:>10,.0f}")
    skips = [f"  {r['name']}: " + ", ".join(f"{n} {reason}" for reason, n in r["skipped"].items())
             for r in rows if r.get("skipped")]
    if skips:
        lines += ["", "skipped records (by reason; also in each meta.json):", *skips]
    left = [f"  {r['name']}: {e['path']} ({e['reason']})" for r in rows for e in r.get("skipped_inputs") or []]
    if left:
        lines += ["", "files left out of the sources (also in each meta.json's skipped_inputs):", *left]
    return "\n".join(lines)
