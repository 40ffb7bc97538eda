"""`build SRC... --out DIR --tokenizer TOK`: one verb for every corpus, tokenizer and scale.

    niels-gpt-data build data/ --out cache/mine --tokenizer my-tokenizer/ --val-tokens 100_000
    niels-gpt-data build data/ --out cache/mine --train-tokenizer 8000       # trains cache/tokenizer first
    niels-gpt-data build 's3://bucket/corpus/*.jsonl' --out s3://bucket/caches/mine --tokenizer tok/
    niels-gpt-data build chats.jsonl --chat --out cache/mine-sft --tokenizer my-tokenizer/
    niels-gpt-data build corpus/ --out /shared/cache/big --tokenizer /shared/tok --executor ray --ray-address auto

The default executor is `auto`: local processes when the plan has several tasks, else inline.
"""

from __future__ import annotations

from niels_gpt.args import int_arg as _int
from niels_gpt.args import optional_int_arg as _optional_int
from niels_gpt.builders.executors import CONNECT_TIMEOUT_S, RAY_ADDRESS, RETRIES
from niels_gpt.builders.plan import make_plan
from niels_gpt.builders.run import ALL_TOKENS, EXECUTORS, ON_BAD_RECORD, BuildSpec, build, format_summary
from niels_gpt.builders.tokenizer import tokenizer_for_build
from niels_gpt.constants import SEED, SHARD_BYTES
from niels_gpt.errors import ConfigError
from niels_gpt.formats.zstd_shard import CODECS
from niels_gpt.seeds import seed_arg
from niels_gpt.sources.documents import LAYOUTS
from niels_gpt.sources.inputs import check_read_as
from niels_gpt.tokenizer import SEPARATOR_CHOICES


def add_read_as_arg(p) -> None:
    p.add_argument("--read-as", action="append", default=[], metavar="SUFFIX=KIND",
                   help="read files of another suffix as text, jsonl, json, csv, parquet or arrow, e.g. --read-as "
                        ".dict=text (repeatable; default: such files are left out and listed in the summary and "
                        "meta.json's skipped_inputs)")


def read_as_map(values: list[str]) -> dict[str, str]:
    """--read-as SUFFIX=KIND ... -> {suffix: kind} (checked by sources/inputs.py::check_read_as)."""
    out = {}
    for v in values or []:
        suffix, eq, kind = v.partition("=")
        if not eq or not suffix or not kind:
            raise ConfigError(f"--read-as {v}: give SUFFIX=KIND, e.g. --read-as .dict=text")
        out[suffix.strip()] = kind.strip()
    check_read_as(out)
    return out


def _add_build_args(p) -> None:
    p.add_argument("sources", nargs="+", metavar="SRC",
                   help="files (.txt .md .raw .jsonl .json(.gz/.zst) .parquet .csv .arrow), directories, globs, URLs "
                        "of files, prefixes or globs (s3://, gs://, hf://, http(s)://, memory://, file://), or a "
                        "dataset id (owner/name)")
    p.add_argument("--out", required=True, help="cache directory to write, or a URL (s3://, gs://, hf://, memory://; "
                   "built locally, then uploaded)")
    tok = p.add_mutually_exclusive_group(required=True)
    tok.add_argument("--tokenizer", help="spm.model, tokenizer.json, a transformers tokenizer directory, a .tiktoken "
                     "file or a tiktoken encoding name (one of --tokenizer and --train-tokenizer is required; no default)")
    tok.add_argument("--train-tokenizer", type=_int, default=None, metavar="VOCAB",
                     help="train the library's tokenizer (VOCAB ordinary pieces) on the sources first, into "
                          "<out's parent>/tokenizer, and build with it (default: use --tokenizer)")
    p.add_argument("--eos", default=None, help="token (text or id) that ends every document (default: the tokenizer's EOS)")
    p.add_argument("--bos", default=None, help="token (text or id) used as BOS (default: the tokenizer's BOS)")
    p.add_argument("--separator", choices=SEPARATOR_CHOICES, default=None,
                   help="eos: EOS after every document (the default); bos: BOS before every document")
    p.add_argument("--chat-template", default=None, metavar="FILE",
                   help="with --chat and a sentencepiece model of its own (Llama, Mistral): the jinja2 chat template "
                        "(default: the chat_template of a tokenizer_config.json beside the model)")
    g = p.add_argument_group("records")
    g.add_argument("--format", dest="layout", choices=LAYOUTS, default=None,
                   help="the records' layout (default: detected from each input's first record)")
    add_read_as_arg(g)
    g.add_argument("--text-field", "--text-column", dest="text_field", default="text",
                   help="field or column holding the document text")
    g.add_argument("--chat", action="store_true", help="build an SFT cache from conversations")
    g.add_argument("--map", default=None, metavar="MODULE:FUNCTION",
                   help="a function run on every document (str) or conversation (list of messages): it returns the "
                        "same kind, or None to drop it (counted as dropped_by_map); importable on every worker "
                        "(default: none)")
    g.add_argument("--min-chars", type=_int, default=0, metavar="N",
                   help="skip documents (conversations: their contents) of fewer than N characters, counted as "
                        "below_min_chars (default: 0, keep all)")
    g.add_argument("--messages-field", default="messages", help="with --chat: field holding [{\"role\", \"content\"}, ...]")
    g.add_argument("--chat-columns", default=None, metavar="USER_COL,ASSISTANT_COL",
                   help="with --chat: one user and one assistant turn from these two columns (default: the messages field)")
    g.add_argument("--on-bad-record", choices=ON_BAD_RECORD, default="error",
                   help="a bad record stops the build naming its file and line, or is skipped and counted in meta.json")
    g.add_argument("--hf-config", default=None, help="config of a dataset id (default: its default config)")
    g.add_argument("--split", default="train", help="split of a dataset id to stream")
    g = p.add_argument_group("budgets and split")
    g.add_argument("--max-tokens", type=_int, default=ALL_TOKENS, help="train token budget (default: all)")
    g.add_argument("--val-tokens", type=_int, default=None, help="val token budget: the first documents (default: no val)")
    g.add_argument("--val-frac", type=float, default=None,
                   help="share of documents (examples with --chat) in val, drawn from --seed (default: no val)")
    g.add_argument("--val-per-input", action="store_true",
                   help="with --val-frac: cut documents at blank lines into pieces of about 4096 characters first, "
                        "so every long input (a book) gives val its share instead of going to val whole")
    g.add_argument("--shard-bytes", type=_int, default=SHARD_BYTES, help="shard size target (never exceeded)")
    g.add_argument("--seed", type=seed_arg, default=SEED, help="seed of the split and the shuffle (torch's draws)")
    g.add_argument("--compress", choices=CODECS, default=None,
                   help="store shards as zstd frames with a frame index (shard_*.bin.zst; readers decompress only "
                        "the frames a window needs; default: uncompressed)")
    g.add_argument("--shuffle-buffer", type=_optional_int, default=None,
                   help="document shuffle buffer (default: off): a dataset id is datasets' shuffle(seed, buffer_size), "
                        "other inputs the builder's buffer (torch's draws); it cannot be planned, so the build runs inline")
    g = p.add_argument_group("where it runs")
    g.add_argument("--executor", choices=EXECUTORS, default="auto",
                   help="auto: local processes when the plan has several tasks, else inline; the cache is the same")
    g.add_argument("--workers", type=int, default=0,
                   help="worker processes / Ray tasks at once, or inline encode workers; 0: one per core")
    g.add_argument("--ray-address", default=RAY_ADDRESS, help="Ray cluster: auto, HOST:PORT, or local")
    g.add_argument("--connect-timeout", type=float, default=CONNECT_TIMEOUT_S,
                   help="seconds to wait for a Ray cluster to answer before giving up")
    g.add_argument("--retries", type=int, default=RETRIES, help="Ray retries of a task whose worker died")
    g.add_argument("--task-bytes", type=_int, default=None,
                   help="input bytes per task (default: the inputs cut into about 64 tasks of 4 MiB to 64 MiB)")
    g.add_argument("--work-dir", default=None, help="parts and receipts of a parallel build: a directory every "
                   "worker sees, or a URL in an object store (s3://, gs://, ...) for nodes that share only that "
                   "(default: OUT.build, beside OUT, a URL when OUT is one)")
    g.add_argument("--keep-parts", action="store_true", help="keep the work directory after the commit")
    g.add_argument("--plan-only", action="store_true", help="print the plan's tasks and exit")
    p.add_argument("--name", default=None, help="dataset_name in meta.json (default: the --out directory's name)")
    p.add_argument("--no-progress", action="store_true", help="no progress (default: a bar on a terminal, a line "
                   "every 30 s in a log or CI, with rate and ETA; NIELS_GPT_PROGRESS_EVERY=SECONDS sets the interval)")


def register(sub) -> None:
    p = sub.add_parser("build",
                       description="Build a pretraining cache (or with --chat an SFT cache) from any mix of local "
                                   "files, directories, globs, URLs and Hugging Face dataset ids, with any tokenizer; "
                                   "byte-identical whichever executor runs it.")
    _add_build_args(p)
    p.set_defaults(func=run_build)


def spec_from_args(args) -> BuildSpec:
    columns = None if args.chat_columns is None else tuple(c.strip() for c in args.chat_columns.split(","))
    if columns is not None and (len(columns) != 2 or not all(columns)):  # before a tokenizer is trained
        raise ConfigError(f"--chat-columns takes USER_COL,ASSISTANT_COL, got {args.chat_columns!r}")
    return BuildSpec(sources=list(args.sources), out=args.out, tokenizer=args.tokenizer, eos=args.eos,
                     bos=args.bos, separator=args.separator, chat_template=args.chat_template, chat=args.chat,
                     layout=args.layout, read_as=read_as_map(args.read_as), text_field=args.text_field,
                     messages_field=args.messages_field, chat_columns=columns, on_bad_record=args.on_bad_record,
                     map=args.map, min_chars=args.min_chars, val_per_input=args.val_per_input,
                     hf_config=args.hf_config, split=args.split, max_tokens=args.max_tokens, val_tokens=args.val_tokens,
                     val_frac=args.val_frac, shard_bytes=args.shard_bytes, seed=args.seed,
                     shuffle_buffer=args.shuffle_buffer, compress=args.compress, executor=args.executor,
                     workers=None if args.workers == 0 else args.workers, ray_address=args.ray_address,
                     retries=args.retries, task_bytes=args.task_bytes, name=args.name, work_dir=args.work_dir,
                     keep_parts=args.keep_parts, progress=False if args.no_progress else None,
                     extra={"connect_timeout": args.connect_timeout})


def run_build(args) -> int:
    if args.workers < 0:
        raise ConfigError(f"--workers {args.workers}: must be >= 0 (0: one per core)")
    if args.connect_timeout <= 0:
        raise ConfigError(f"--connect-timeout {args.connect_timeout}: must be > 0 seconds")
    spec = spec_from_args(args)
    if args.train_tokenizer is not None:
        spec.tokenizer = tokenizer_for_build(spec, args.train_tokenizer, progress=spec.progress)
    elif args.tokenizer is None:
        raise ConfigError("give --tokenizer PATH (or --train-tokenizer VOCAB to train one on the sources first)")
    if args.plan_only:
        plan = make_plan(spec.sources, tokenizer=spec.loaded_tokenizer(), task_bytes=spec.task_bytes, rules=spec.rules, chat=spec.chat,
                         layout=spec.layout, config=spec.hf_config, split=spec.split, read_as=spec.read_as)
        for t in plan.tasks:
            print(f"{t.id}  {t.bytes:>12,} B  {t.layout:<9} {t.where()}")
        for d in plan.left_out:
            print(f"left out  {d['path']}: {d['reason']}")
        print(f"{len(plan.tasks)} tasks, {sum(t.bytes for t in plan.tasks):,} input bytes; tasks of about "
              f"{plan.task_bytes:,} bytes{'' if spec.task_bytes else ' (the default for these inputs; --task-bytes N)'}")
        return 0
    shown = spec.tokenizer if isinstance(spec.tokenizer, str) else getattr(spec.tokenizer, "model_path", "?")
    print(f"build: {len(spec.sources)} source(s) -> {spec.out}; tokenizer {shown}; "
          f"{'chat (SFT)' if spec.chat else 'pretraining'}; executor {spec.executor}")
    summary = build(spec)
    print(format_summary(summary))
    return 0
