"""`build SRC... --out DIR --tokenizer TOK`: any corpus, any tokenizer, one command, the usual cache.

    niels-gpt-data build data/ --out cache/mine --tokenizer my-tokenizer/ --val-tokens 100_000
    niels-gpt-data build 's3://bucket/corpus/*.jsonl' --out s3://bucket/caches/mine --tokenizer my-tokenizer/
    niels-gpt-data build chats.jsonl --chat --out cache/mine-sft --tokenizer my-tokenizer/

- The sources are read by niels_gpt.sources.corpus (files, directories, globs, URLs, dataset ids) and go
  through the builders every cache uses (build_pretrain_cache, build_sft_cache): same format, same
  meta.json, byte-identical for any --workers.
- Pretraining split: --val-tokens (the first documents fill val, as build-all does) or --val-frac
  (each document goes to val with that probability: a torch draw per document from --seed; the input is
  then read twice, once per split). --chat builds an SFT cache split by example with --val-frac.
- The tokenizer keeps its own conventions (--eos/--bos/--separator; niels_gpt.tokenizer.base).
"""

from __future__ import annotations

from pathlib import Path

import torch

from niels_gpt.args import int_arg as _int
from niels_gpt.args import optional_int_arg as _optional_int
from niels_gpt.builders.caches import (
    SEED,
    SHARD_BYTES,
    SplitTexts,
    build_pretrain_cache,
    build_sft_cache,
)
from niels_gpt.errors import ConfigError
from niels_gpt.formats.zstd_shard import CODECS
from niels_gpt.meta import read_meta
from niels_gpt.seeds import seed_arg
from niels_gpt.sources.corpus import MESSAGES_FIELD, ON_BAD_RECORD, TEXT_FIELD, corpus
from niels_gpt.storage.upload import writes_to_url
from niels_gpt.tokenizer import SEPARATOR_CHOICES, load_tokenizer

ALL_TOKENS = 2**62  # no budget: every document
SFT_VAL_FRAC = 0.0
DRAW_BLOCK = 1024


def by_fraction(texts, val_frac: float, seed: int, want_val: bool):
    """The documents of one split when each goes to val with probability val_frac (torch draws from seed)."""
    g = torch.Generator().manual_seed(seed)
    draws: list[float] = []
    for text in texts:
        if not draws:
            draws = torch.rand(DRAW_BLOCK, generator=g, dtype=torch.float64).tolist()[::-1]
        if (draws.pop() < val_frac) == want_val:
            yield text


@writes_to_url  # out may be an fsspec URL: built locally (named after it), uploaded, meta.json last
def build_corpus(sources, out: str, *, tokenizer, chat: bool = False, text_field: str = TEXT_FIELD,
                 messages_field: str = MESSAGES_FIELD, chat_columns=None, max_tokens: int = ALL_TOKENS,
                 val_tokens: int | None = None, val_frac: float | None = None, shard_bytes: int = SHARD_BYTES,
                 seed: int = SEED, shuffle_buffer: int | None = None, workers: int | None = 1,
                 on_bad_record: str = "error", hf_config: str | None = None, split: str = "train",
                 name: str | None = None, progress: bool | None = False, compress: str | None = None) -> dict:
    """Build a pretraining (or, with chat=True, SFT) cache at `out` from `sources`; returns its meta.json."""
    def make():
        return corpus(sources, text_field=text_field, messages_field=messages_field, chat_columns=chat_columns,
                      on_bad_record=on_bad_record, hf_config=hf_config, split=split)

    src = make()
    name = name or Path(out).name
    config = src.dataset_config
    if chat:
        unused = [flag for flag, set_ in (("--val-tokens", val_tokens is not None), ("--max-tokens", max_tokens != ALL_TOKENS),
                                          ("--shuffle-buffer", bool(shuffle_buffer)), ("--shard-bytes", shard_bytes != SHARD_BYTES),
                                          ("--compress", compress is not None))
                  if set_]
        if unused:
            raise ConfigError(f"{', '.join(unused)} apply to pretraining caches; an SFT cache (--chat) keeps every "
                              "example in stream order and is split by example with --val-frac")
        build_sft_cache(src.iter_conversations(), out, tokenizer=tokenizer,
                        val_frac=SFT_VAL_FRAC if val_frac is None else val_frac, seed=seed, dataset_name=name,
                        dataset_config=config, streaming=bool(src.dataset_id), source=src.describe,
                        progress=progress, num_workers=workers)
        return read_meta(out)
    if val_tokens is not None and val_frac is not None:
        raise ConfigError("give --val-tokens or --val-frac, not both")
    common = dict(tokenizer=tokenizer, max_train_tokens=max_tokens, shard_bytes=shard_bytes, seed=seed,
                  shuffle_buffer=shuffle_buffer, num_workers=workers, dataset_name=name, dataset_config=config,
                  streaming=bool(src.dataset_id), progress=progress, compress=compress)
    if val_frac is None:
        build_pretrain_cache(src.iter_texts(), out, max_val_tokens=val_tokens or 0, source=src.describe,
                             input_bytes=src.input_bytes(), **common)
    else:
        if not 0.0 < val_frac < 1.0:
            raise ConfigError(f"--val-frac must be in (0, 1), got {val_frac}")
        src.split_rule = (f"by document: g = torch.Generator().manual_seed({seed}); the k-th non-empty document goes "
                          f"to val when the k-th draw of torch.rand({DRAW_BLOCK}, generator=g, dtype=torch.float64) "
                          f"blocks is < {val_frac!r}")
        val_src = make()  # its own reader, so the skip counts are those of one pass (train's)
        texts = SplitTexts(train=by_fraction(src.iter_texts(), val_frac, seed, False),
                           val=by_fraction(val_src.iter_texts(), val_frac, seed, True))
        build_pretrain_cache(texts, out, max_val_tokens=ALL_TOKENS, source=src.describe, **common)
    return read_meta(out)


def add_separator_args(p) -> None:
    """--eos/--bos/--separator: a tokenizer's document conventions (build and dist-build share them)."""
    p.add_argument("--eos", default=None, help="token (text or id) that ends every document (default: the tokenizer's EOS)")
    p.add_argument("--bos", default=None, help="token (text or id) used as BOS (default: the tokenizer's BOS)")
    p.add_argument("--separator", choices=SEPARATOR_CHOICES, default=None,
                   help="eos: EOS after every document (the default); bos: BOS before every document")


def register(sub) -> None:
    p = sub.add_parser("build", help="build a cache from your own files or a dataset id with any tokenizer",
                       description="Build a pretraining cache (or with --chat an SFT cache) from any mix of local "
                                   "files, directories, globs, URLs and Hugging Face dataset ids, with any tokenizer.")
    p.add_argument("sources", nargs="+", metavar="SRC",
                   help="files (.txt .md .jsonl .json(.gz/.zst) .parquet .csv .arrow), directories, globs, URLs of "
                        "files, prefixes or globs (s3://, gs://, hf://, http(s)://, memory://, file://), or a "
                        "dataset id (owner/name)")
    p.add_argument("--out", required=True, help="cache directory to write, or a URL (s3://, gs://, hf://, memory://; "
                   "built locally, then uploaded)")
    p.add_argument("--tokenizer", required=True,
                   help="spm.model, tokenizer.json, a transformers tokenizer directory, a .tiktoken file or a "
                        "tiktoken encoding name")
    add_separator_args(p)
    p.add_argument("--text-field", "--text-column", dest="text_field", default=TEXT_FIELD,
                   help="field or column holding the document text")
    p.add_argument("--chat", action="store_true", help="build an SFT cache from conversations")
    p.add_argument("--messages-field", default=MESSAGES_FIELD,
                   help="with --chat: field holding [{\"role\", \"content\"}, ...]")
    p.add_argument("--chat-columns", default=None, metavar="USER_COL,ASSISTANT_COL",
                   help="with --chat: one user and one assistant turn from these two columns (default: the messages field)")
    p.add_argument("--hf-config", default=None, help="config of a dataset id (default: its default config)")
    p.add_argument("--split", default="train", help="split of a dataset id to stream")
    p.add_argument("--max-tokens", type=_int, default=ALL_TOKENS, help="train token budget (default: all)")
    p.add_argument("--val-tokens", type=_int, default=None, help="val token budget: the first documents (default: no val)")
    p.add_argument("--val-frac", type=float, default=None,
                   help="share of documents (examples with --chat) in val, drawn from --seed (default: no val)")
    p.add_argument("--shard-bytes", type=_int, default=SHARD_BYTES, help="shard size target (never exceeded)")
    p.add_argument("--seed", type=seed_arg, default=SEED, help="seed of the split and the shuffle (torch RNG)")
    p.add_argument("--shuffle-buffer", type=_optional_int, default=None,
                   help="torch-RNG document shuffle buffer (default: off)")
    p.add_argument("--workers", type=int, default=1,
                   help="encode workers (with --chat: render threads), 0 for one per core: threads, forked processes "
                        "for a tiktoken tokenizer; the output is identical for any value")
    p.add_argument("--on-bad-record", choices=ON_BAD_RECORD, default="error",
                   help="a bad record stops the build naming its file and line, or is skipped and counted in meta.json")
    p.add_argument("--name", default=None, help="dataset_name in meta.json (default: the --out directory's name)")
    p.add_argument("--compress", choices=CODECS, default=None,
                   help="store shards as zstd frames with a frame index (shard_*.bin.zst; readers decompress only "
                        "the frames a window needs; default: uncompressed)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (it shows only on a terminal)")
    p.set_defaults(func=run_build)


def run_build(args) -> int:
    tok = load_tokenizer(args.tokenizer, eos=args.eos, bos=args.bos, separator=args.separator)
    columns = None
    if args.chat_columns is not None:
        columns = [c.strip() for c in args.chat_columns.split(",")]
        if len(columns) != 2 or not all(columns):
            raise ConfigError(f"--chat-columns takes USER_COL,ASSISTANT_COL, got {args.chat_columns!r}")
    print(f"build: {len(args.sources)} source(s) -> {args.out}; tokenizer {tok.backend} {tok.model_path} "
          f"({len(tok)} ids, {tok.token_dtype.name}); " + (
              "chat rendering: " + ("its chat template" if tok.chat_template else "the library's sentinels")
              if args.chat else f"separator {tok.separator.describe()}"))
    meta = build_corpus(args.sources, args.out, tokenizer=tok, chat=args.chat, text_field=args.text_field,
                        messages_field=args.messages_field, chat_columns=columns, max_tokens=args.max_tokens,
                        val_tokens=args.val_tokens, val_frac=args.val_frac, shard_bytes=args.shard_bytes,
                        seed=args.seed, shuffle_buffer=args.shuffle_buffer,
                        workers=None if args.workers == 0 else args.workers, on_bad_record=args.on_bad_record,
                        hf_config=args.hf_config, split=args.split, name=args.name,
                        progress=False if args.no_progress else None, compress=args.compress)
    totals = meta["totals"]
    print(f"built {meta['kind']} cache {args.out}: " + ", ".join(f"{k} {v:,}" for k, v in sorted(totals.items()))
          + (f"; skipped {meta['skipped']}" if meta.get("skipped") else ""))
    return 0



