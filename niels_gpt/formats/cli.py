"""Subcommands `convert` and `prepare-data` (registered into `python -m niels_gpt.cli`).

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

from niels_gpt.args import int_arg
from niels_gpt.errors import FormatError
from niels_gpt.formats.base import BLOCK_TOKENS, dtype_name
from niels_gpt.formats.bos_index import load_bos_index
from niels_gpt.formats.convert import convert
from niels_gpt.formats.detect import FORMATS, FormatInfo, detect_format
from niels_gpt.formats.kempner_dataset import MemoryMappedDataset
from niels_gpt.formats.nanogpt_dataset import NanogptDataset
from niels_gpt.formats.zstd_shard import CODECS

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
                   help="dtype of a headerless source .bin without meta (default: none; never guessed)")
    p.add_argument("--max-tokens-per-file", type=int_arg, default=None,
                   help="roll over to a new file after this many tokens (default: per format)")
    p.add_argument("--shard-bytes", type=int_arg, default=DEFAULT_SHARD_BYTES,
                   help=f"niels/raw shard size (default {DEFAULT_SHARD_BYTES})")
    p.add_argument("--split", default="train", help="split name for a source without splits (default train)")
    p.add_argument("--not-for-kempnerforge", action="store_true",
                   help="raw: write uint16 .bin files with an even token count, which KempnerForge misreads "
                        "as uint32 (for readers that are told the dtype; KempnerForge wants --to kempner-npy)")
    p.add_argument("--compress", choices=CODECS, default=None,
                   help="--to niels: shards as zstd frames with a frame index (default: uncompressed)")
    p.set_defaults(func=_convert)

    q = subparsers.add_parser("prepare-data", help="validate a token directory and print how to train on it")
    q.add_argument("dir", help="token file or directory in any supported format")
    q.add_argument("--seq-len", type=int, default=DEFAULT_SEQ_LEN, help=f"default {DEFAULT_SEQ_LEN}")
    q.add_argument("--dtype", default=None, choices=("uint16", "uint32"), help="dtype of a headerless .bin (default: what meta.json or metadata.yaml records; never guessed)")
    q.add_argument("--eot-id", type=int, default=None, help="EOT id (default: recorded)")
    q.add_argument("--bos-id", type=int, default=None,
                   help="BOS id of BOS-prefixed shards (default: recorded, or named by .bos.idx sidecars)")
    q.add_argument("--no-scan", action="store_true", help="skip the pass over the tokens")
    q.add_argument("--json", action="store_true", help="print the report as JSON")
    q.set_defaults(func=_prepare)


def _convert(args) -> int:
    summary = convert(args.src, args.dst, to=args.to, bos_index=args.bos_index, bos_id=args.bos_id,
                      eot_id=args.eot_id, dtype=args.dtype, src_dtype=args.src_dtype, split=args.split,
                      max_tokens_per_file=args.max_tokens_per_file, shard_bytes=args.shard_bytes,
                      not_for_kempnerforge=args.not_for_kempnerforge, compress=args.compress)
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


def _find_bos(leaf: FormatInfo, where: str, warnings_out: list[str]) -> int | None:
    """The BOS id a nanoGPT leaf's `.bos.idx` sidecars name, or None; a sidecar that names none warns."""
    for tf in leaf.token_files:
        try:
            found = load_bos_index(tf.path, tf.open(), None)
        except FormatError as exc:
            warnings_out.append(str(exc))
            return None
        if found:
            return found[1]
    return None


def _target(leaf: FormatInfo, path: str, split_root: bool) -> tuple[str, str | None]:
    """(path, file_pattern) that opens exactly this leaf from Python."""
    if leaf.pattern:
        return leaf.path, leaf.pattern
    return (leaf.path if split_root else str(path)), None


def _calls(leaf: FormatInfo, target: tuple[str, str | None], *, seq_len: int, eot, bos, dtype, counts: dict | None,
           do_scan: bool) -> list[str]:
    """The dataset calls to print for one leaf, each built here first: what is printed runs as printed.

    MemoryMappedDataset packs documents only when an EOS id is known. NanogptDataset aligns windows
    to the token that opens documents (the BOS if the stream has one, else the EOT that precedes
    every document but the first, modded-nanogpt's convention) only when the scan found that token
    and the aligned dataset has at least one window; otherwise it is printed unaligned.
    """
    d, pattern = target
    extra = {"dtype": dtype} if dtype is not None and leaf.format == "raw" else {}
    mm = {"seq_len": seq_len, **({"file_pattern": pattern} if pattern else {}), **extra}
    if eot is not None:
        mm.update(pack_sequences=True, eos_token_id=eot)
    files = f"{d}/{pattern}" if pattern else d
    ng = {"seq_len": seq_len, **extra}
    out = []
    MemoryMappedDataset(d, **mm)
    out.append(f"MemoryMappedDataset({d!r}, {_kwargs(mm)})")
    align = None
    if do_scan and counts is not None:
        if bos is not None and counts.get("bos_count"):
            align = bos
        elif eot is not None and counts.get("eot_count"):
            align = eot
    if align is not None:
        aligned = {**ng, "bos_token": align, "align_to_bos": True}
        if len(NanogptDataset(files, **aligned)):
            out.append(f"NanogptDataset({files!r}, {_kwargs(aligned)})")
            return out
    NanogptDataset(files, **ng)
    out.append(f"NanogptDataset({files!r}, {_kwargs(ng)})")
    return out


def _kwargs(kw: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kw.items())


def report(path: str, *, seq_len: int, dtype=None, eot_id=None, bos_id=None, do_scan: bool = True) -> dict:
    info = detect_format(path, dtype)
    out = {"path": str(path), "format": info.format, "dtype": dtype_name(info.dtype) if info.dtype.kind == "u"
           else str(info.dtype), "vocab_size": info.vocab_size, "splits": {}, "warnings": list(info.warnings)}
    for name, leaf in (info.splits or {"": info}).items():
        eot = eot_id if eot_id is not None else leaf.eot_id
        bos = bos_id if bos_id is not None else leaf.bos_id
        where = leaf.path if not leaf.pattern else f"{leaf.path}/{leaf.pattern}"
        if leaf.format.startswith("nanogpt") and bos is None:
            bos = _find_bos(leaf, where, out["warnings"])
        rep = {"files": len(leaf.files), "tokens": leaf.num_tokens, "eot_id": eot, "bos_id": bos,
               "samples": sum(t.count // (seq_len + 1) for t in leaf.token_files)}
        counts = None
        if do_scan and leaf.num_tokens:
            counts = scan(leaf, eot, bos)
            rep.update(counts)
            if info.vocab_size is not None and rep["max_id"] >= info.vocab_size:
                out["warnings"].append(f"{where}: token id {rep['max_id']} >= vocab size {info.vocab_size}")
            bos_framed = bos is not None and rep["first_token"] == bos  # documents open with BOS instead
            if eot is not None and rep["last_token"] != eot and info.format != "megatron" and not bos_framed:
                out["warnings"].append(f"{where}: the last document does not end with EOT {eot}")
        if leaf.format in ("raw", "niels") and info.dtype.itemsize == 2 and any(
                (t.count * 2) % 4 == 0 for t in leaf.token_files):
            out["warnings"].append(f"{where}: uint16 .bin shards; KempnerForge infers uint32 from sizes divisible "
                                   "by 4 and would misread them: give it .npy (convert --to kempner-npy)")
        target = _target(leaf, path, bool(info.splits))
        rep["calls"] = _calls(leaf, target, seq_len=seq_len, eot=eot, bos=bos, dtype=dtype, counts=counts,
                              do_scan=do_scan)
        if leaf.format == "kempner-npy":
            pack = " --data.pack_sequences true" if eot is not None else ""
            rep["kempnerforge"] = (f"--data.dataset_path {target[0]} --data.file_pattern "
                                   f"'{target[1] or '*.npy'}'{pack} --data.seq_len {seq_len}")
        if leaf.format == "megatron":
            rep["megatron_data_path"] = [i.prefix for i in leaf.megatron]
        out["splits"][name or "all"] = rep
    return out


def _print_report(rep: dict, seq_len: int) -> None:
    print(f"{rep['path']}: {rep['format']}, {rep['dtype']}, vocab {rep['vocab_size']}")
    for name, s in rep["splits"].items():
        extra = f", max id {s['max_id']}, {s['eot_count']} EOT" if "max_id" in s else ""
        print(f"  {name}: {s['files']} file(s), {s['tokens']} tokens, {s['samples']} samples of "
              f"{seq_len}+1{extra}")
    print("\nfrom niels_gpt.formats.kempner_dataset import MemoryMappedDataset")
    print("from niels_gpt.formats.nanogpt_dataset import NanogptDataset")
    for name, s in rep["splits"].items():
        print(f"# {name}: train on it with")
        for call in s["calls"]:
            print(call)
        if "kempnerforge" in s:
            print(f"# KempnerForge: {s['kempnerforge']}")
        if "megatron_data_path" in s:
            print(f"# Megatron-LM: --data-path {' '.join(s['megatron_data_path'])} --seq-length {seq_len}")
    for w in rep["warnings"]:
        print(f"warning: {w}", file=sys.stderr)


def _prepare(args) -> int:
    rep = report(args.dir, seq_len=args.seq_len, dtype=args.dtype, eot_id=args.eot_id, bos_id=args.bos_id,
                 do_scan=not args.no_scan)
    if args.json:
        print(json.dumps(rep, indent=2, sort_keys=True))
    else:
        _print_report(rep, args.seq_len)
    return 0
