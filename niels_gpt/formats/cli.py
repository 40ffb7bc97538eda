"""Subcommands `convert` and `prepare-data` (registered into `python -m niels_gpt.cache.cli`).

    convert SRC DST --to {niels,nanogpt,nanogpt-legacy,kempner-npy,raw,megatron} [--bos-index]
    prepare-data DIR [--seq-len 1024]

`prepare-data` is the KempnerForge validator's job done through our readers: it opens DIR with
detect_format (every header and size checked), scans the tokens once (max id against the vocab,
documents, a terminated last document, BOS sidecars), and prints the exact settings to train on it
with each dataset, plus warnings (e.g. .bin shards KempnerForge would misread as uint32).
"""

from __future__ import annotations

import json
import sys

import numpy as np

from niels_gpt.cache.formats import FORMATS, FormatInfo, detect_format
from niels_gpt.formats.base import BLOCK_TOKENS, dtype_name

DEFAULT_SEQ_LEN = 1024
DEFAULT_SHARD_BYTES = 128 * 1024 * 1024


def register(subparsers) -> None:
    p = subparsers.add_parser("convert", help="convert a token corpus between formats (no re-tokenizing)")
    p.add_argument("src", help="token file or directory in any supported format")
    p.add_argument("dst", help="new output directory (must not exist or be empty)")
    p.add_argument("--to", required=True, choices=FORMATS, help="output format")
    p.add_argument("--bos-index", action="store_true",
                   help="nanogpt: BOS-prefix every document and write <stem>.bos.idx sidecars")
    p.add_argument("--bos-id", type=int, default=None, help="BOS id (default: the source's, else its EOT)")
    p.add_argument("--eot-id", type=int, default=None, help="EOT id ending each document (default: recorded)")
    p.add_argument("--dtype", default=None, choices=("uint16", "uint32"),
                   help="output token dtype (default: the source's)")
    p.add_argument("--src-dtype", default=None, choices=("uint16", "uint32"),
                   help="dtype of a headerless source .bin without meta (never guessed)")
    p.add_argument("--max-tokens-per-file", type=int, default=None,
                   help="roll over to a new file after this many tokens (default: per format)")
    p.add_argument("--shard-bytes", type=int, default=DEFAULT_SHARD_BYTES,
                   help=f"niels/raw shard size (default {DEFAULT_SHARD_BYTES})")
    p.add_argument("--split", default="train", help="split name for a source without splits (default train)")
    p.set_defaults(func=_convert)

    q = subparsers.add_parser("prepare-data", help="validate a token directory and print how to train on it")
    q.add_argument("dir", help="token file or directory in any supported format")
    q.add_argument("--seq-len", type=int, default=DEFAULT_SEQ_LEN, help=f"default {DEFAULT_SEQ_LEN}")
    q.add_argument("--dtype", default=None, choices=("uint16", "uint32"), help="dtype of headerless .bin")
    q.add_argument("--eot-id", type=int, default=None, help="EOT id (default: recorded)")
    q.add_argument("--no-scan", action="store_true", help="skip the pass over the tokens")
    q.add_argument("--json", action="store_true", help="print the report as JSON")
    q.set_defaults(func=_prepare)


def _convert(args) -> int:
    from niels_gpt.formats.convert import convert

    summary = convert(args.src, args.dst, to=args.to, bos_index=args.bos_index, bos_id=args.bos_id,
                      eot_id=args.eot_id, dtype=args.dtype, src_dtype=args.src_dtype, split=args.split,
                      max_tokens_per_file=args.max_tokens_per_file, shard_bytes=args.shard_bytes)
    for name, s in summary["splits"].items():
        print(f"{name}: {s['tokens']} tokens, {s['documents']} documents, {len(s['records'])} file(s), "
              f"{s['dtype']}, eot={s['eot_id']} bos={s['bos_id']}")
    print(f"wrote {args.dst} ({args.to}, from {summary['source']})")
    return 0


def scan(info: FormatInfo, eot: int | None, bos: int | None) -> dict:
    """One pass: max id, EOT and BOS counts, the first and last token."""
    hi, eots, boss, first, last = -1, 0, 0, None, None
    for tf in info.token_files:
        arr = tf.open()
        for s in range(0, len(arr), BLOCK_TOKENS):
            blk = np.asarray(arr[s:s + BLOCK_TOKENS])
            hi = max(hi, int(blk.max()))
            if eot is not None:
                eots += int(np.count_nonzero(blk == eot))
            if bos is not None:
                boss += int(np.count_nonzero(blk == bos))
            first = int(blk[0]) if first is None else first
            last = int(blk[-1])
    return {"max_id": hi, "eot_count": eots, "bos_count": boss, "first_token": first, "last_token": last}


def report(path: str, *, seq_len: int, dtype=None, eot_id=None, do_scan: bool = True) -> dict:
    info = detect_format(path, dtype)
    out = {"path": str(path), "format": info.format, "dtype": dtype_name(info.dtype) if info.dtype.kind == "u"
           else str(info.dtype), "vocab_size": info.vocab_size, "splits": {}, "warnings": list(info.warnings)}
    for name, leaf in (info.splits or {"": info}).items():
        eot = eot_id if eot_id is not None else leaf.eot_id
        bos = leaf.bos_id
        rep = {"files": len(leaf.files), "tokens": leaf.num_tokens, "eot_id": eot, "bos_id": bos,
               "samples": sum(t.count // (seq_len + 1) for t in leaf.token_files)}
        where = leaf.path
        if leaf.format.startswith("nanogpt") and bos is None:
            from niels_gpt.formats.bos_index import load_bos_index

            for tf in leaf.token_files:
                found = load_bos_index(tf.path, tf.open(), None)
                if found:
                    bos = rep["bos_id"] = found[1]
                    break
        if do_scan and leaf.num_tokens:
            rep.update(scan(leaf, eot, bos))
            if info.vocab_size is not None and rep["max_id"] >= info.vocab_size:
                out["warnings"].append(f"{where}: token id {rep['max_id']} >= vocab size {info.vocab_size}")
            bos_framed = bos is not None and rep["first_token"] == bos  # documents open with BOS instead
            if eot is not None and rep["last_token"] != eot and info.format != "megatron" and not bos_framed:
                out["warnings"].append(f"{where}: the last document does not end with EOT {eot}")
        if leaf.format in ("raw", "niels") and info.dtype.itemsize == 2 and any(
                (t.count * 2) % 4 == 0 for t in leaf.token_files):
            out["warnings"].append(f"{where}: uint16 .bin shards; KempnerForge infers uint32 from sizes divisible "
                                   "by 4 and would misread them: give it .npy (convert --to kempner-npy)")
        out["splits"][name or "all"] = rep
    return out


def _print_report(rep: dict, seq_len: int) -> None:
    print(f"{rep['path']}: {rep['format']}, {rep['dtype']}, vocab {rep['vocab_size']}")
    for name, s in rep["splits"].items():
        extra = f", max id {s['max_id']}, {s['eot_count']} EOT" if "max_id" in s else ""
        print(f"  {name}: {s['files']} file(s), {s['tokens']} tokens, {s['samples']} samples of "
              f"{seq_len}+1{extra}")
    for name, s in rep["splits"].items():
        d = rep["path"] if name == "all" else f"{rep['path']}/{name}"
        print(f"\n# {name}: train on it with")
        print(f"MemoryMappedDataset({d!r}, seq_len={seq_len}, pack_sequences=True"
              + (f", eos_token_id={s['eot_id']})" if s["eot_id"] is not None else ")"))
        bos = s["bos_id"] if s["bos_id"] is not None else s["eot_id"]
        print(f"NanogptDataset({d!r}, seq_len={seq_len}, bos_token={bos}, align_to_bos={bos is not None})")
        if rep["format"] == "kempner-npy":
            print(f"KempnerForge: --data.dataset_path {d} --data.file_pattern '*.npy' "
                  f"--data.pack_sequences true --data.seq_len {seq_len}")
        if rep["format"] == "megatron":
            print(f"Megatron-LM: --data-path {d}/<prefix> --seq-length {seq_len}")
    for w in rep["warnings"]:
        print(f"warning: {w}", file=sys.stderr)


def _prepare(args) -> int:
    rep = report(args.dir, seq_len=args.seq_len, dtype=args.dtype, eot_id=args.eot_id, do_scan=not args.no_scan)
    if args.json:
        print(json.dumps(rep, indent=2, sort_keys=True))
    else:
        _print_report(rep, args.seq_len)
    return 0
