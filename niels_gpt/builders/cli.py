"""`dist-build`: a pretraining cache from local files or a `datasets` stream, on processes or Ray.

    niels-gpt-data dist-build corpus/*.jsonl --out cache/pretrain/mine --tokenizer cache/tokenizer
    niels-gpt-data dist-build corpus/ --out /shared/cache/mine --tokenizer /shared/tok --executor ray --ray-address auto

The flags share their names with the other build commands (--out, --tokenizer, --eos, --bos,
--separator, --max-tokens, --val-tokens, --shard-bytes, --seed, --workers). Rerunning the same command resumes.
"""

from __future__ import annotations

from niels_gpt.args import int_arg as _int
from niels_gpt.args import optional_int_arg as _optional_int
from niels_gpt.builders.caches import MAX_VAL_TOKENS, SEED, SHARD_BYTES
from niels_gpt.builders.corpus import add_separator_args
from niels_gpt.builders.dist import dist_build, format_summary
from niels_gpt.builders.executors import EXECUTORS, RAY_ADDRESS, RETRIES
from niels_gpt.builders.plan import TASK_BYTES, TEXT_FIELD, make_plan
from niels_gpt.seeds import seed_arg
from niels_gpt.tokenizer import load_tokenizer

ALL_TOKENS = 2**62  # no train budget: every document that val does not take


def register(sub) -> None:
    p = sub.add_parser("dist-build", help="build a pretraining cache from files or a datasets stream on "
                       "local processes or a Ray cluster (byte-identical to a one-process build)")
    p.add_argument("inputs", nargs="*", metavar="INPUT",
                   help="files or directories (.jsonl/.json: one document per line; .parquet; .txt/.raw: one per file)")
    p.add_argument("--out", required=True, help="cache directory to write (train/, val/, meta.json), or an fsspec URL (committed locally, then uploaded)")
    p.add_argument("--tokenizer", required=True, help="tokenizer directory or model file (every worker opens it by path)")
    add_separator_args(p)
    p.add_argument("--max-tokens", type=_int, default=ALL_TOKENS, help="train token budget (default: all)")
    p.add_argument("--val-tokens", type=_int, default=MAX_VAL_TOKENS, help="val token budget (the first documents)")
    p.add_argument("--shard-bytes", type=_int, default=SHARD_BYTES, help="shard size target (never exceeded)")
    p.add_argument("--seed", type=seed_arg, default=SEED, help="recorded seed (and the shuffle buffer's)")
    p.add_argument("--workers", type=int, default=None, help="worker processes / Ray tasks at once (default: all cores)")
    p.add_argument("--executor", choices=EXECUTORS, default="processes", help="where tasks run")
    p.add_argument("--ray-address", default=RAY_ADDRESS, help="Ray cluster: auto, HOST:PORT, or local")
    p.add_argument("--retries", type=int, default=RETRIES, help="Ray retries of a task whose worker died")
    p.add_argument("--task-bytes", type=_int, default=TASK_BYTES, help="input bytes per task")
    p.add_argument("--text-field", default=TEXT_FIELD, help="field or column holding the document text")
    p.add_argument("--name", default=None, help="dataset_name in meta.json (default: the --out directory's name)")
    p.add_argument("--shuffle-buffer", type=_optional_int, default=None,
                   help="torch-RNG document shuffle buffer (default: off); a buffer cannot be planned, so the build runs on one process")
    p.add_argument("--work-dir", default=None, help="parts and receipts, on a filesystem every worker sees "
                   "(default: OUT.dist-build, beside OUT)")
    p.add_argument("--keep-parts", action="store_true", help="keep the work directory after the commit")
    p.add_argument("--plan-only", action="store_true", help="print the plan's tasks and exit")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    g = p.add_argument_group("a datasets stream instead of INPUT files (one task per shard)")
    g.add_argument("--hf-dataset", default=None, help="hub id or packaged builder (json, parquet, text) (default: read the INPUT files)")
    g.add_argument("--hf-config", default=None, help="dataset config name (default: the dataset's default)")
    g.add_argument("--hf-split", default="train", help="split")
    g.add_argument("--hf-data-files", nargs="+", default=None, help="data files for a packaged builder (default: none)")
    p.set_defaults(func=run)


def _hf(args) -> dict | None:
    if args.hf_dataset is None:
        return None
    return {"path": args.hf_dataset, "name": args.hf_config, "split": args.hf_split,
            "data_files": args.hf_data_files}


def run(args) -> int:
    if args.plan_only:
        tok = load_tokenizer(args.tokenizer, eos=args.eos, bos=args.bos, separator=args.separator)
        plan = make_plan(args.inputs, tokenizer=tok, task_bytes=args.task_bytes,
                         text_field=args.text_field, hf=_hf(args))
        for t in plan.tasks:
            print(f"{t.id}  {t.bytes:>12,} B  {t.where()}")
        print(f"{len(plan.tasks)} tasks, {sum(t.bytes for t in plan.tasks):,} input bytes")
        return 0
    print("dist-build settings:")
    for k in ("inputs", "out", "tokenizer", "eos", "bos", "separator", "max_tokens", "val_tokens", "shard_bytes", "seed", "workers",
              "executor", "ray_address", "task_bytes", "text_field", "shuffle_buffer"):
        print(f"  {k} = {getattr(args, k)!r}")
    summary = dist_build(args.inputs, args.out, tokenizer=args.tokenizer, max_train_tokens=args.max_tokens,
                         max_val_tokens=args.val_tokens, shard_bytes=args.shard_bytes, seed=args.seed,
                         executor=args.executor, workers=args.workers, ray_address=args.ray_address,
                         retries=args.retries, task_bytes=args.task_bytes, text_field=args.text_field,
                         hf=_hf(args), dataset_name=args.name, shuffle_buffer=args.shuffle_buffer,
                         work_dir=args.work_dir, keep_parts=args.keep_parts,
                         progress=None if not args.no_progress else False, eos=args.eos, bos=args.bos,
                         separator=args.separator)
    print(format_summary(summary))
    return 0
