"""python -m niels_gpt.cli <command>: build, inspect and verify token caches.

    python -m niels_gpt.cli build-all --cache-dir cache --seed 42
    python -m niels_gpt.cli build-all --cache-dir cache-demo --sample     # offline, bundled corpus
    python -m niels_gpt.cli inspect cache/sft/dolly15k
    python -m niels_gpt.cli verify cache

Every constant of the contract is a flag whose help shows its default; the resolved settings are
printed at start. Package errors end as one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import json
import math
import os
import sys
from dataclasses import fields
from pathlib import Path

from niels_gpt import allocator
from niels_gpt.args import HelpFormatter, command_of, exit_with, hidden_alias, package_version, program_name
from niels_gpt.args import int_arg as _int
from niels_gpt.args import optional_int_arg as _optional_int
from niels_gpt.builders import cli as build_cli
from niels_gpt.builders.build_all import ALL, BuildConfig, build_all, build_tokenizer, format_summary
from niels_gpt.errors import ConfigError, NielsGPTError
from niels_gpt.seeds import seed_arg
from niels_gpt.sources.documents import LAYOUTS, Rules
from niels_gpt.sources.named import NAMED, OPTIONS
from niels_gpt.storage.fs import allow_transfers, ctrl_c_stops_transfers, stop_transfers
from niels_gpt.storage.remote import errors_named, read_location, tokenizer_near
from niels_gpt.storage.settings import configure, restore, snapshot
from niels_gpt.tokenizer.spm import TrainSettings

# Every subcommand in --help order: (name, one-line help, the module whose register(sub) adds its parser, or
# a function of this one). NOTE: `main` builds only the parser of the command it runs, so a verb that does
# not need torch (build, convert, verify, ...) and --help start without importing it (~1.5 s).
VERBS = (
    ("build", "build a cache from your own files, URLs or a dataset id, with any tokenizer, inline, on local "
              "processes or on Ray", "niels_gpt.builders.cli"),
    ("build-all", "train the tokenizer and build every cache of the bundled recipe", "add_build_all"),
    ("train-tokenizer", "train the library's tokenizer on your own files (or build-all's sources)",
     "add_train_tokenizer"),
    ("inspect", "show a cache: meta, totals, a decoded window, an SFT example's trained span", "add_output_verbs"),
    ("verify", "check every output against its metadata: sizes, counts, sha256, headers", "add_output_verbs"),
    ("stats", "figures of a cache, packed directory or converted output: tokens, documents, length percentiles, "
              "EOT/BOS, SFT trained fraction, packing fill", "add_output_verbs"),
    ("convert", "convert a token corpus between formats (no re-tokenizing)", "niels_gpt.formats.cli"),
    ("prepare-data", "validate a token directory and print how to train on it", "niels_gpt.formats.cli"),
    ("pack-sft", "pack an SFT cache split into memmap_padded_v1 bins", "niels_gpt.packing.cli"),
    ("download", "download numbered Parquet text shards (parallel, retried, atomic)", "niels_gpt.loading.cli"),
    ("train", "train the GPT on a cache, mixture, Parquet shards or packed SFT bins", "niels_gpt.train.cli"),
    ("sample", "print what a checkpoint's model writes after a prompt", "niels_gpt.train.cli"),
    ("trace", "which documents were in step N of a run (or which steps saw a document)", "niels_gpt.trace.cli"),
)
HELP = {name: text for name, text, _ in VERBS}
NETWORK_TIMEOUT_HELP = ("how long a store or server may take to answer, or leave a transfer without a byte "
                        "(a transfer that keeps moving is never cut; default: $NIELS_GPT_NETWORK_TIMEOUT_S, "
                        "else 30)")


class _Named:
    """The subparsers action as a registrar sees it: each verb's one-line help comes from VERBS."""

    def __init__(self, sub):
        self.sub = sub

    def add_parser(self, name, **kwargs):
        kwargs["help"] = HELP[name]
        return self.sub.add_parser(name, **kwargs)


def add_build_all(sub) -> None:
    d = BuildConfig()
    p = sub.add_parser("build-all", description="Train (or copy) the tokenizer, then build every pretraining and SFT cache.")
    _add_common_flags(p, d)
    p.add_argument("--only", nargs="+", default=list(ALL), metavar="NAME", help=f"build a subset of: {' '.join(ALL)}")
    p.add_argument("--tokenizer", default=None,
                   help="copy this sentencepiece model instead of training one (default: train one)")
    p.add_argument("--workers", type=int, default=d.workers,
                   help="encode threads (default: all cores); the output is identical for any value")
    _add_tokenizer_flags(p)
    _add_source_flags(p, d, budgets=True)
    p.set_defaults(func=run_build_all)


def _add_common_flags(p, d) -> None:
    p.add_argument("--cache-dir", default=d.cache_dir, help="root of the caches: a directory or a URL (s3://, gs://, hf://, memory://; built locally, then uploaded)")
    p.add_argument("--seed", type=seed_arg, default=d.seed, help="seed of every split and shuffle (torch RNG)")
    p.add_argument("--sample", action="store_true", help="point every source at the bundled sample corpus (offline)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (they show only on a terminal)")


def _add_tokenizer_flags(p) -> None:
    t = TrainSettings()
    g = p.add_argument_group("tokenizer training")
    g.add_argument("--vocab-size", type=int, default=t.vocab_size, help="ordinary pieces (4 special tokens come on top)")
    g.add_argument("--model-type", default=t.model_type, choices=["bpe", "unigram"], help="sentencepiece model type")
    g.add_argument("--character-coverage", type=float, default=t.character_coverage,
                   help="share of characters covered by pieces; the rest fall back to bytes")
    g.add_argument("--tokenizer-threads", type=int, default=t.num_threads, help="trainer threads (part of the model's identity)")
    g.add_argument("--tokenizer-max-chars", type=_int, default=t.max_train_chars, help="characters of text to train on")
    g.add_argument("--max-chars", type=_int, default=t.max_chars, help="train on a seeded sample of this many characters (default: all)")
    g.add_argument("--doc-chars", type=_int, default=t.doc_chars, help="with --max-chars: characters kept a document")
    g.add_argument("--max-sentence-length", type=int, default=t.max_sentence_length, help="bytes per training chunk")
    g.add_argument("--no-split-digits", dest="split_digits", action="store_false",
                   help="let a piece span several digits (by default every digit is its own piece)")
    g.add_argument("--replace-tokenizer", action="store_true",
                   help="replace the tokenizer even though caches that this run does not rebuild used the old one")


def _add_source_flags(p, d, *, budgets: bool) -> None:
    """Each named source's options (sources/named.py), then build-all's budgets."""
    for named in NAMED.values():
        g = p.add_argument_group(named.title)
        for option in named.options:
            option.add_to(g)
    if budgets:
        g = p.add_argument_group("budgets and shards")
        train = g.add_argument("--max-tokens", dest="max_train_tokens", type=_int, default=d.max_train_tokens,
                               help="fineweb_edu's train token budget")
        val = g.add_argument("--val-tokens", dest="max_val_tokens", type=_int, default=None,
                             help="fineweb_edu's val token budget (default: 5_000_000, or 4096 with --sample)")
        hidden_alias(g, "--max-train-tokens", train)
        hidden_alias(g, "--max-val-tokens", val)
        g.add_argument("--shard-bytes", type=_int, default=d.shard_bytes, help="shard size target (never exceeded)")
        g.add_argument("--shuffle-buffer", type=_optional_int, default=d.shuffle_buffer,
                       help="seeded document shuffle buffer of the pretraining caches (default: off, and fineweb_edu "
                            "keeps its own buffer; 0 or none: off)")
        g.add_argument("--val-frac", type=float, default=d.val_frac, help="fraction of SFT examples in val (seeded)")


def config_from_args(args):
    settings = TrainSettings(vocab_size=args.vocab_size, model_type=args.model_type,
                             character_coverage=args.character_coverage, num_threads=args.tokenizer_threads,
                             max_train_chars=args.tokenizer_max_chars, seed=args.seed,
                             max_sentence_length=args.max_sentence_length, split_digits=args.split_digits,
                             max_chars=args.max_chars, doc_chars=args.doc_chars)
    names = {f.name for f in fields(BuildConfig)}
    kw = {k: v for k, v in vars(args).items() if k in names}
    kw.update(only=tuple(args.only), tokenizer_settings=settings, progress=None if not args.no_progress else False,
              options={name: getattr(args, name) for name in OPTIONS})
    return BuildConfig(**kw)


def run_build_all(args) -> int:
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
    d = BuildConfig()
    p = sub.add_parser("train-tokenizer", description="Train the library's sentencepiece tokenizer on SRC (anything `build` reads) into "
                                   "--out; without SRC, build-all's tokenizer step into --cache-dir/tokenizer.")
    p.add_argument("sources", nargs="*", metavar="SRC",
                   help="files, directories, globs, URLs or dataset ids, as `build` takes them (default: build-all's "
                        "sources)")
    p.add_argument("--out", default=None, help="the tokenizer directory to write, with SRC (default: none)")
    g = p.add_argument_group("records of SRC")
    g.add_argument("--chat", action="store_true", help="SRC holds conversations: train on their messages' text")
    g.add_argument("--format", dest="layout", choices=LAYOUTS, default=None,
                   help="the records' layout (default: detected from each input's first record)")
    g.add_argument("--text-field", default="text", help="field or column holding the document text")
    g.add_argument("--messages-field", default="messages", help="with --chat: field holding the messages")
    g.add_argument("--on-bad-record", choices=("error", "skip"), default="error",
                   help="a bad record stops training naming its file and line, or is skipped")
    build_cli.add_read_as_arg(g)
    _add_common_flags(p, d)
    _add_tokenizer_flags(p)
    p.add_argument("--trainer", choices=("sentencepiece", "rustbpe"), default="sentencepiece", help="with SRC")
    _add_source_flags(p, d, budgets=False)
    p.set_defaults(func=run_train_tokenizer)


def run_train_tokenizer(args) -> int:
    args.only, args.tokenizer = ["tokenizer"], None
    if args.sources or args.out is not None:
        if not args.sources or args.out is None:
            raise ConfigError("train-tokenizer SRC... --out DIR: give both the sources and the output directory "
                              "(or neither, for build-all's tokenizer step into --cache-dir)")
        from niels_gpt.builders.tokenizer import train_on_sources  # lazy: the trainer's progress only here

        settings = config_from_args(args).tokenizer_settings
        rules = Rules(text_field=args.text_field, messages_field=args.messages_field, on_bad_record=args.on_bad_record)
        tok = train_on_sources(args.sources, args.out, settings=settings, rules=rules, chat=args.chat,
                               layout=args.layout, progress=False if args.no_progress else None,
                               read_as=build_cli.read_as_map(args.read_as), trainer=args.trainer)
        print(f"tokenizer: {len(tok)} ids, sha256 {tok.sha256[:16]}… -> {args.out}")
        return 0
    if args.read_as or args.trainer != "sentencepiece":
        raise ConfigError(f"{'--read-as' if args.read_as else f'--trainer {args.trainer}'} applies to the files of "
                          "SRC: give train-tokenizer SRC... --out DIR with it")
    cfg = config_from_args(args)
    row = build_tokenizer(cfg)
    print(f"tokenizer: {row['vocab_size']} ids, sha256 {row['sha256']}… -> {Path(cfg.cache_dir) / 'tokenizer'}")
    return 0


def add_output_verbs(sub) -> None:
    """inspect, verify and stats: the verbs that look at outputs."""
    p = sub.add_parser("inspect")
    p.add_argument("path", help="a cache, a root of caches, a packed directory or a converted output; or the URL "
                   "of a cache or packed directory")
    p.add_argument("--tokenizer", default=None, help="tokenizer (default: <root>/tokenizer found above PATH)")
    p.add_argument("--window", type=int, default=64, help="tokens to decode")
    p.add_argument("--json", action="store_true", help="print each cache's meta.json (without its file list) as JSON")
    p.set_defaults(func=_inspect)
    p = sub.add_parser("verify")
    p.add_argument("path", help="a cache, a root of caches, a packed directory or a converted output; or the URL "
                   "of a cache or packed directory (every file downloaded and checked)")
    p.set_defaults(func=_verify)
    p = sub.add_parser("stats")
    p.add_argument("path", help="a cache (root or split directory), a packed directory or a converted output; or "
                   "the URL of a cache, split directory or packed directory")
    p.add_argument("--png", default=None, metavar="OUT", help="write PNG figures into this directory (plot extra); default: text tables only")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--seq-len", type=int, default=1024, metavar="T",
                   help="SFT: count examples that keep no trained target at this sequence length")
    p.add_argument("--steps", type=int, default=1000, help="mixture config: steps to draw")
    p.add_argument("--batch", type=int, default=64, help="mixture config: global batch size (samples per step)")
    p.set_defaults(func=_stats)


def _stats(args) -> int:
    # lazy: the readers and formats (~30 ms) only for the verbs that look at outputs
    from niels_gpt.locate import locate
    from niels_gpt.report import cache_stats, format_stats, plot_stats

    path, named, _ = read_location(args.path)
    with errors_named(named):
        found = locate(path)  # the one door: a missing path, an unfinished build or a text file said as such
        if found.kind == "mixture":
            from niels_gpt.report import mixture_stats  # lazy: its draws are torch's (~1 s to import)

            st = mixture_stats(path, steps=args.steps, global_batch_size=args.batch)
        else:
            st = cache_stats(path, seq_len=args.seq_len)
    st.path = named(st.path)
    print(named(json.dumps(st.to_dict(), indent=2) if args.json else format_stats(st)))
    if args.png:
        drawn = plot_stats(st, args.png)
        print(f"wrote {len(drawn)} PNG file(s) to {args.png}: {', '.join(drawn)}", file=sys.stderr)
    return 0


def _inspect(args) -> int:
    # lazy: the readers and formats (~30 ms) only for the verbs that look at outputs
    from niels_gpt.locate import locate
    from niels_gpt.report import inspect_json, inspect_path

    path, named, _ = read_location(args.path, everything=not args.json)
    tokenizer = args.tokenizer
    if tokenizer is None and named is not str and not args.json:
        tokenizer = tokenizer_near(args.path)  # a tokenizer directory beside or above the cache URL
    with errors_named(named):
        locate(path)  # the one door: a missing path, an unfinished build or a text file said as such
        if args.json:
            print(named(inspect_json(path)))
            return 0
        print(named(inspect_path(path, tokenizer=None if tokenizer is None else str(tokenizer), window=args.window)))
    return 0


def _verify(args) -> int:
    from niels_gpt.report import verify_outputs  # lazy: the readers and formats (~30 ms) only here

    path, named, failed = read_location(args.path, collect=True, fresh=True)  # every byte at the URL, checked
    with errors_named(named):
        problems, checked, seen = verify_outputs(path)
    # NOTE: a file that failed its download is absent from the mirror; its download error says why
    problems = failed + [named(p) for p in problems if not any(named(p).startswith(f.split(": ", 1)[0] + ":")
                                                                for f in failed)]
    for line in seen:
        print(f"checked {named(line)}")
    for line in problems:
        print(f"MISMATCH {line}")
    print(f"verify: {checked} output(s), {len(problems)} problem(s)")
    return 1 if problems else 0


def build_parser(prog: str | None = None, only: str | None = None) -> argparse.ArgumentParser:
    """The CLI's parser with every command's flags; `only=COMMAND`: with that command's flags alone, the other
    commands named (what `main` uses: a command imports only what it runs)."""
    commands = " ".join(name for name, _, _ in VERBS)
    parser = argparse.ArgumentParser(prog=prog or program_name(), formatter_class=HelpFormatter,
                                     description="Token caches and data loading for training language models. "
                                                 f"Commands: {commands}. `COMMAND --help` for each one's flags.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    parser.add_argument("--network-timeout", type=float, default=None, metavar="SECONDS",
                        help="before or after the command: " + NETWORK_TIMEOUT_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    wanted = {where for name, _, where in VERBS if only is None or name == only}
    for name, text, where in VERBS:
        if name in sub.choices:
            continue
        if where in wanted:  # a function of this module, or the register() of a module imported only now
            register = globals().get(where) or importlib.import_module(where).register
            register(_Named(sub))
            wanted.discard(where)
        else:
            sub.add_parser(name, help=text, add_help=False)  # named in --help; its flags are not needed here
    for p in sub.choices.values():
        p.formatter_class = HelpFormatter
        # NOTE: accepted after the command too (`verify URL --network-timeout 5`), where users put flags
        p.add_argument("--network-timeout", dest="network_timeout_after", type=float, default=None,
                       metavar="SECONDS", help=NETWORK_TIMEOUT_HELP)
    return parser


# OS conditions a user fixes on their side: one line naming the file, never a traceback
_NO_SPACE = "free space or choose another location; an unfinished output has no commit marker"
_ONE_LINE_ERRNOS = {
    errno.ENOSPC: _NO_SPACE,
    errno.EDQUOT: _NO_SPACE,
    errno.EROFS: "the filesystem is read-only: choose a writable location",
    errno.EACCES: "permission denied: choose a location you can write (or read) or fix its permissions",
    errno.EPERM: "operation not permitted: choose a location you can write or fix its permissions",
}


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    command = command_of(words)
    args = build_parser(only=command if command in HELP else "").parse_args(argv)
    allow_transfers()
    restore_ctrl_c = ctrl_c_stops_transfers()
    # NOTE: main() also runs inside a Python process (a notebook, a test): its flags' settings end with it
    settings = snapshot()
    try:
        timeout = getattr(args, "network_timeout_after", None)
        timeout = args.network_timeout if timeout is None else timeout
        if timeout is not None:
            if not (math.isfinite(timeout) and timeout > 0):
                raise ConfigError(f"--network-timeout {timeout:g}: must be a positive number of seconds (finite: "
                                  "it bounds a stall, so a slow transfer is never cut), e.g. --network-timeout 120")
            configure(timeout_s=timeout)
        # freed memory kept for reuse while the command works (niels_gpt/allocator.py); a model's commands decide
        # by device (train keeps it on CPU only: a CUDA run's host memory is left as it is)
        with contextlib.nullcontext() if command in ("train", "sample") else allocator.kept():
            return int(args.func(args) or 0)
    except NielsGPTError as exc:
        reason = " | ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        print(f"error: {reason}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # the reader of our output left (`... | head`): say nothing more, as other command-line tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush writes nowhere
        return 141  # 128 + SIGPIPE
    except OSError as exc:
        if exc.errno not in _ONE_LINE_ERRNOS:
            raise  # not a condition of the user's machine we can explain better than the traceback
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"error: {where}{exc.strerror or exc}; {_ONE_LINE_ERRNOS[exc.errno]}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        stop_transfers()  # a download on another thread (a prefetcher) ends too, its temporary removed
        print("error: interrupted; finished caches are intact, the unfinished one has no meta.json", file=sys.stderr)
        return 130
    finally:
        restore_ctrl_c()
        restore(settings)


if __name__ == "__main__":
    exit_with(main())
