"""python -m niels_gpt.cache.cli <command>: build, inspect and verify token caches.

    python -m niels_gpt.cache.cli build-all --cache-dir cache --seed 42
    python -m niels_gpt.cache.cli build-all --cache-dir cache-demo --sample     # offline, bundled corpus
    python -m niels_gpt.cache.cli inspect cache/sft/dolly15k
    python -m niels_gpt.cache.cli verify cache

Every constant of the contract is a flag whose help shows its default; the resolved settings are
printed at start. Package errors end as one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import fields
from pathlib import Path

from niels_gpt.errors import NielsGPTError

SUBCOMMAND_MODULES = ("niels_gpt.formats.cli", "niels_gpt.packing.cli", "niels_gpt.loading.cli",
                      "niels_gpt.train.cli", "niels_gpt.build.cli")


def _int(text: str) -> int:
    """Integers as 200_000_000, 200000000 or 128MB/128MiB-style byte counts."""
    t = text.strip().replace("_", "")
    for suffix, mult in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10), ("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if t.endswith(suffix):
            return int(float(t[: -len(suffix)]) * mult)
    return int(t)


def _optional_int(text: str) -> int | None:
    return None if text.lower() in ("none", "off", "0") else _int(text)


def add_build_all(sub) -> None:
    from niels_gpt.build_all import ALL, BuildConfig
    from niels_gpt.tokenizer.spm import TrainSettings

    d = BuildConfig()
    p = sub.add_parser("build-all", help="train the tokenizer and build every cache",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--cache-dir", default=d.cache_dir, help="root of the caches")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of every split and shuffle (torch RNG)")
    p.add_argument("--only", nargs="+", default=list(ALL), metavar="NAME", help=f"build a subset of: {' '.join(ALL)}")
    p.add_argument("--sample", action="store_true", help="point every source at the bundled sample corpus (offline)")
    p.add_argument("--tokenizer", default=None, help="copy this sentencepiece model instead of training one")
    p.add_argument("--workers", type=int, default=d.workers, help="encode threads (None: all cores); output is identical for any value")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    t = TrainSettings()
    g = p.add_argument_group("tokenizer training")
    g.add_argument("--vocab-size", type=int, default=t.vocab_size, help="ordinary pieces (4 special tokens come on top)")
    g.add_argument("--model-type", default=t.model_type, choices=["unigram", "bpe"])
    g.add_argument("--character-coverage", type=float, default=t.character_coverage)
    g.add_argument("--tokenizer-threads", type=int, default=t.num_threads, help="trainer threads (part of the model's identity)")
    g.add_argument("--tokenizer-max-chars", type=_int, default=t.max_train_chars, help="characters of text to train on")
    g.add_argument("--max-sentence-length", type=int, default=t.max_sentence_length, help="bytes per training chunk")
    g.add_argument("--no-split-digits", dest="split_digits", action="store_false", help="let pieces span several digits")
    g = p.add_argument_group("fineweb_edu (streamed)")
    g.add_argument("--fineweb-dataset", default=d.fineweb_dataset)
    g.add_argument("--fineweb-config", default=d.fineweb_config)
    g.add_argument("--fineweb-split", default=d.fineweb_split)
    g.add_argument("--fineweb-buffer-size", type=int, default=d.fineweb_buffer_size, help="datasets .shuffle buffer")
    g.add_argument("--fineweb-data-files", nargs="+", default=None, help="local parquet/jsonl files of the same schema")
    g.add_argument("--max-train-tokens", type=_int, default=d.max_train_tokens)
    g.add_argument("--max-val-tokens", type=_int, default=None, help="default 5_000_000 (4096 with --sample)")
    g.add_argument("--shard-bytes", type=_int, default=d.shard_bytes, help="shard size target (never exceeded)")
    g.add_argument("--shuffle-buffer", type=_optional_int, default=d.shuffle_buffer, help="torch-RNG document shuffle buffer")
    g = p.add_argument_group("wikitext")
    g.add_argument("--wikitext-dataset", default=d.wikitext_dataset)
    g.add_argument("--wikitext-config", default=d.wikitext_config)
    g.add_argument("--wikitext-train-file", default=None, help="local raw file instead of the hub")
    g.add_argument("--wikitext-val-file", default=None)
    g = p.add_argument_group("local directories")
    g.add_argument("--roam-dir", default=None, help="Roam Research markdown export")
    g.add_argument("--roam-val-frac", type=float, default=d.roam_val_frac)
    g.add_argument("--gutenberg-dir", default=None, help="Project Gutenberg .txt books (not built when absent)")
    g.add_argument("--gutenberg-val-frac", type=float, default=d.gutenberg_val_frac)
    g = p.add_argument_group("sft")
    g.add_argument("--val-frac", type=float, default=d.val_frac, help="fraction of examples in val (seeded)")
    g.add_argument("--dolly-dataset", default=d.dolly_dataset)
    g.add_argument("--dolly-data-files", nargs="+", default=None)
    g.add_argument("--oasst-dataset", default=d.oasst_dataset)
    g.add_argument("--oasst-data-files", nargs="+", default=None)
    g.add_argument("--oasst-trees-jsonl", default=None, help="nested-tree JSONL export instead of flat rows")
    for action in p._actions:
        if action.help is None:  # the defaults formatter only shows a default next to help text
            action.help = "-"
    p.set_defaults(func=run_build_all)


def config_from_args(args):
    from niels_gpt.build_all import BuildConfig
    from niels_gpt.tokenizer.spm import TrainSettings

    settings = TrainSettings(vocab_size=args.vocab_size, model_type=args.model_type,
                             character_coverage=args.character_coverage, num_threads=args.tokenizer_threads,
                             max_train_chars=args.tokenizer_max_chars, seed=args.seed,
                             max_sentence_length=args.max_sentence_length, split_digits=args.split_digits)
    names = {f.name for f in fields(BuildConfig)}
    kw = {k: v for k, v in vars(args).items() if k in names}
    kw.update(only=tuple(args.only), tokenizer_settings=settings, progress=None if not args.no_progress else False)
    return BuildConfig(**kw)


def run_build_all(args) -> int:
    from niels_gpt.build_all import build_all, format_summary

    cfg = config_from_args(args)
    print("build-all settings:")
    for f in fields(cfg):
        print(f"  {f.name} = {getattr(cfg, f.name)!r}")
    print(f"  (resolved) max_val_tokens = {cfg.resolved_max_val_tokens()}")
    rows = build_all(cfg)
    print()
    print(format_summary(rows))
    return 0


def add_train_tokenizer(sub) -> None:
    p = sub.add_parser("train-tokenizer", help="train the sentencepiece tokenizer only",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_build_all_like = sub.choices["build-all"]
    for action in add_build_all_like._actions:
        if action.dest in ("help", "only", "tokenizer"):
            continue
        p._add_action(action)
    p.set_defaults(func=run_train_tokenizer)


def run_train_tokenizer(args) -> int:
    from niels_gpt.build_all import build_tokenizer

    args.only, args.tokenizer = ["tokenizer"], None
    cfg = config_from_args(args)
    row = build_tokenizer(cfg)
    print(f"tokenizer: {row['vocab_size']} ids, sha256 {row['sha256']}… -> {Path(cfg.cache_dir) / 'tokenizer'}")
    return 0


def add_inspect_verify(sub) -> None:
    p = sub.add_parser("inspect", help="show a cache: meta, totals, a decoded window, an SFT example's trained span")
    p.add_argument("path", help="a cache directory (or a root of caches)")
    p.add_argument("--tokenizer", default=None, help="tokenizer (default: <root>/tokenizer found above PATH)")
    p.add_argument("--window", type=int, default=64, help="tokens of pretraining text to decode")
    p.set_defaults(func=lambda a: _inspect(a))
    p = sub.add_parser("verify", help="check sizes, counts and sha256 of every file against meta.json")
    p.add_argument("path", help="a cache directory or a root of caches")
    p.set_defaults(func=lambda a: _verify(a))


def _inspect(args) -> int:
    from niels_gpt.report import inspect_path

    print(inspect_path(args.path, tokenizer=args.tokenizer, window=args.window))
    return 0


def _verify(args) -> int:
    from niels_gpt.report import verify_outputs

    problems, checked, seen = verify_outputs(args.path)
    for line in seen:
        print(f"checked {line}")
    for line in problems:
        print(f"MISMATCH {line}")
    print(f"verify: {checked} output(s), {len(problems)} problem(s)")
    return 1 if problems else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m niels_gpt.cache.cli",
                                     description="niels_gpt token caches: build, inspect, verify, convert, pack")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_build_all(sub)
    add_train_tokenizer(sub)
    add_inspect_verify(sub)
    for module in SUBCOMMAND_MODULES:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            continue
        if hasattr(mod, "register"):
            mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except NielsGPTError as exc:
        reason = " | ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        print(f"error: {reason}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted; finished caches are intact, the unfinished one has no meta.json", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
