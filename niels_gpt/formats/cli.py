"""Subcommands `convert` and `prepare-data` (registered into `python -m niels_gpt.cli`).

    convert SRC DST --to FORMAT [--bos-index]     (FORMAT by name or by its reader: formats/names.py)
    prepare-data DIR [--seq-len 1024]
"""

from __future__ import annotations

import json
import sys

from niels_gpt.args import int_arg
from niels_gpt.constants import SHARD_BYTES
from niels_gpt.formats.convert import convert
from niels_gpt.formats.names import NAMES, PRESETS, canonical_format, formats_help, reader_of
from niels_gpt.formats.zstd_shard import CODECS

DEFAULT_SEQ_LEN = 1024


def register(subparsers) -> None:
    p = subparsers.add_parser("convert", epilog=formats_help())
    p.add_argument("src", help="token file or directory in any supported format")
    p.add_argument("dst", help="output directory: new, empty, or an earlier output of convert (replaced whole)")
    p.add_argument("--to", required=True, choices=NAMES, metavar="FORMAT",
                   help="output format, by its name or by the program that reads it (listed below)")
    p.add_argument("--bos-index", action="store_true",
                   help="nanogpt: BOS-prefix every document and write <stem>.bos.idx sidecars")
    p.add_argument("--bos-id", type=int, default=None, help="BOS id (default: the source's, else its EOT)")
    p.add_argument("--eot-id", type=int, default=None, help="EOT id ending each document (default: recorded)")
    p.add_argument("--dtype", default=None, choices=("uint16", "uint32"),
                   help="output token dtype (default: the source's)")
    p.add_argument("--src-dtype", default=None, choices=("uint16", "uint32"),
                   help="dtype of a headerless source .bin without meta (default: none; never guessed)")
    p.add_argument("--max-tokens-per-file", type=int_arg, default=None,
                   help="roll over to a new file after this many tokens (default: per format)")
    p.add_argument("--shard-bytes", type=int_arg, default=SHARD_BYTES,
                   help="niels/raw shard size (default 128 MiB)")
    p.add_argument("--split", default="train", help="split name for a source without splits (default train)")
    p.add_argument("--not-for-kempnerforge", action="store_true",
                   help="raw: no note about uint16 .bin files with an even token count, which KempnerForge misreads "
                        "as uint32 (the output is for readers told the dtype; KempnerForge wants --to kempner-npy)")
    p.add_argument("--compress", choices=CODECS, default=None,
                   help="--to niels: shards as zstd frames with a frame index (default: uncompressed)")
    p.set_defaults(func=_convert)

    q = subparsers.add_parser("prepare-data")
    q.add_argument("dir", help="token file or directory in any supported format")
    q.add_argument("--seq-len", type=int, default=DEFAULT_SEQ_LEN, help=f"default {DEFAULT_SEQ_LEN}")
    q.add_argument("--dtype", default=None, choices=("uint16", "uint32"), help="dtype of a headerless .bin (default: what meta.json or metadata.yaml records; never guessed)")
    q.add_argument("--eot-id", type=int, default=None, help="EOT id (default: recorded)")
    q.add_argument("--bos-id", type=int, default=None,
                   help="BOS id of BOS-prefixed shards (default: recorded, or named by .bos.idx sidecars)")
    q.add_argument("--tokenizer", default=None, metavar="PATH",
                   help="the tokenizer that made the tokens: names its BOS id when a .bos.idx sidecar disagrees "
                        "with its shard (default: none)")
    q.add_argument("--no-scan", action="store_true", help="skip the pass over the tokens")
    q.add_argument("--json", action="store_true", help="print the report as JSON")
    q.set_defaults(func=_prepare)


def _convert(args) -> int:
    to = canonical_format(args.to)
    summary = convert(args.src, args.dst, to=args.to, bos_index=args.bos_index, bos_id=args.bos_id,
                      eot_id=args.eot_id, dtype=args.dtype, src_dtype=args.src_dtype, split=args.split,
                      max_tokens_per_file=args.max_tokens_per_file, shard_bytes=args.shard_bytes,
                      not_for_kempnerforge=args.not_for_kempnerforge or args.to in PRESETS, compress=args.compress)
    for name, s in summary["splits"].items():
        print(f"{name}: {s['tokens']} tokens, {s['documents']} documents, {len(s['records'])} file(s), "
              f"{s['dtype']}, eot={s['eot_id']} bos={s['bos_id']}")
    named = f"{to}, as {args.to}" if to != args.to else to
    print(f"wrote {args.dst} ({named}, from {summary['source']}); read by {reader_of(args.to)}")
    if args.to == "nanogpt-train-bin":
        for name, s in summary["splits"].items():
            (rec,) = s["records"]
            print(f"nanoGPT: link {rec['path']} as <data_dir>/{'val' if name == 'val' else 'train'}.bin")
    for note in summary["notes"]:
        print(f"convert: note: {note}", file=sys.stderr)
    return 0


def _prepare(args) -> int:
    # lazy: it imports torch (~1.5 s); convert and every --help start without it
    from niels_gpt.formats.prepare import print_report, report

    rep = report(args.dir, seq_len=args.seq_len, dtype=args.dtype, eot_id=args.eot_id, bos_id=args.bos_id,
                 do_scan=not args.no_scan, tokenizer=args.tokenizer)
    if args.json:
        print(json.dumps(rep, indent=2, sort_keys=True))
    else:
        print_report(rep, args.seq_len)
    return 0
