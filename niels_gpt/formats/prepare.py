"""`prepare-data`: the KempnerForge validator's job done through our readers.

It opens a token file or directory with detect_format (every header and size checked), scans the tokens once
(max id against the vocabulary, EOT/BOS counts, the last document's EOT, BOS sidecars) and prints the settings
to train on it with each dataset, each built first, plus warnings. Ids that do not look like tokens (a flat
histogram, or ids up to the dtype's top with no EOT/BOS) are warned about above those settings. The histogram
is flat when the most frequent 1% of the distinct ids in the first 1 Mi tokens cover under 5% of them (figures:
docs/formats.md).

Cost: one pass over the tokens (BLOCK_TOKENS at a time) and one np.unique over the first SAMPLE_TOKENS.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from niels_gpt.errors import FormatError
from niels_gpt.formats.base import check_ids, dtype_name, iter_blocks
from niels_gpt.formats.bos_index import load_bos_index
from niels_gpt.formats.detect import FormatInfo, detect_format
from niels_gpt.formats.kempner_dataset import MemoryMappedDataset
from niels_gpt.formats.nanogpt_dataset import NanogptDataset
from niels_gpt.formats.raw import kempnerforge_note
from niels_gpt.formats.writers import refuse_packed_bins

SAMPLE_TOKENS = 1 << 20  # the id histogram is taken over the first ones
MIN_SAMPLE = 10_000  # fewer tokens say nothing about the histogram's shape
TOP_SHARE = 0.01  # the most frequent 1% of the distinct ids ...
FLAT_BELOW = 0.05  # ... cover less than 5% of the tokens: flat
NEAR_MAX = 0.999  # ids this close to the dtype's maximum


def scan(info: FormatInfo, eot: int | None, bos: int | None) -> dict:
    """One pass: max id, EOT and BOS counts, the first and last token, and the share of the first SAMPLE_TOKENS
    that the most frequent TOP_SHARE of their distinct ids cover."""
    hi, eots, boss, first, last, sample = -1, 0, 0, None, None, None
    for blk in iter_blocks(info.token_files):
        hi = max(hi, int(blk.max()))
        if eot is not None:
            eots += int(np.count_nonzero(blk == eot))
        if bos is not None:
            boss += int(np.count_nonzero(blk == bos))
        first = int(blk[0]) if first is None else first
        last = int(blk[-1])
        sample = blk[:SAMPLE_TOKENS] if sample is None else sample
    top = None
    if sample is not None and len(sample) >= MIN_SAMPLE:
        counts = np.sort(np.unique(sample, return_counts=True)[1])[::-1]
        top = float(counts[:max(1, int(len(counts) * TOP_SHARE))].sum() / len(sample))
    return {"max_id": hi, "eot_count": eots, "bos_count": boss, "first_token": first, "last_token": last,
            "top_ids_share": top}


def not_like_tokens(counts: dict, dtype: np.dtype, vocab: int | None, eot, bos) -> str | None:
    """Why the scanned ids do not look like tokens of `vocab` in `dtype`, or None."""
    reasons = []
    if counts.get("top_ids_share") is not None and counts["top_ids_share"] < FLAT_BELOW:
        reasons.append(f"the id histogram is flat (the most frequent {TOP_SHARE:.0%} of the ids cover "
                       f"{counts['top_ids_share']:.1%} of the first tokens; in tokens of text they cover 20% and more)")
    top = np.iinfo(dtype).max
    near = vocab is None and counts["max_id"] >= NEAR_MAX * top
    separators = [x for x in (eot, bos) if x is not None]
    found = counts.get("eot_count", 0) + counts.get("bos_count", 0)
    if near and (not separators or not found):
        reasons.append(f"ids reach {counts['max_id']:,}, the top of {dtype_name(dtype)}, with no vocabulary recorded, "
                       + ("and no EOT or BOS id recorded or given" if not separators else
                          f"and not one EOT/BOS ({', '.join(map(str, separators))}) in them"))
    if not reasons:
        return None
    return (f"these ids do not look like tokens of a {dtype_name(dtype)} vocabulary: {'; '.join(reasons)}. Check "
            "that the file holds token ids and that --dtype is right (text, random bytes or uint32 read as uint16 "
            "look like this) before training on it")


def tokenizer_bos(path: str) -> tuple[int, str]:
    """(BOS id, where it comes from) of the tokenizer at `path`: its BOS, else its EOT (modded-nanogpt's)."""
    from niels_gpt.tokenizer import load_tokenizer  # lazy: only prepare-data --tokenizer loads a tokenizer

    tok = load_tokenizer(path)
    if tok.bos_id is not None:
        return tok.bos_id, f"the tokenizer {path}"
    return tok.eot_id, f"the tokenizer {path} (its EOT: it has no BOS, and opens documents with its EOT)"


def _find_bos(leaf: FormatInfo, warnings_out: list[str], known_bos) -> int | None:
    """The BOS id a nanoGPT leaf's `.bos.idx` sidecars name, or None; a sidecar that names none warns."""
    for tf in leaf.token_files:
        try:
            found = load_bos_index(tf.path, tf.open(), None, known_bos=known_bos)
        except FormatError as exc:
            warnings_out.append(str(exc))
            return None
        if found:
            return found[1]
    return None


def _calls(leaf: FormatInfo, d: str, pattern: str | None, *, seq_len: int, eot, bos, dtype,
           counts: dict | None) -> list[str]:
    """The dataset calls to print for one leaf, each built here first: what is printed runs as printed.

    MemoryMappedDataset packs documents when an EOS id is known; NanogptDataset aligns windows to the BOS (else
    the EOT, modded-nanogpt's convention) when the scan found it and the aligned dataset has a window.
    """
    extra = {"dtype": dtype} if dtype is not None and leaf.format == "raw" else {}
    mm = {"seq_len": seq_len, **({"file_pattern": pattern} if pattern else {}), **extra}
    if eot is not None:
        mm.update(pack_sequences=True, eos_token_id=eot)
    MemoryMappedDataset(d, **mm)
    files = f"{d}/{pattern}" if pattern else d
    ng = {"seq_len": seq_len, **extra}
    found = counts or {}  # no scan: no alignment
    align = bos if bos is not None and found.get("bos_count") else None
    if align is None and eot is not None and found.get("eot_count"):
        align = eot
    aligned = {**ng, "bos_token": align, "align_to_bos": True}
    if align is not None and len(NanogptDataset(files, **aligned)):
        ng = aligned
    else:
        NanogptDataset(files, **ng)
    return [f"MemoryMappedDataset({d!r}, {_kwargs(mm)})", f"NanogptDataset({files!r}, {_kwargs(ng)})"]


def _kwargs(kw: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kw.items())


def report(path: str, *, seq_len: int, dtype=None, eot_id=None, bos_id=None, do_scan: bool = True,
           tokenizer: str | None = None) -> dict:
    refuse_packed_bins(path, "prepare-data")
    info = detect_format(path, dtype)
    check_ids(info.dtype, eot_id=eot_id, bos_id=bos_id)
    known_bos = None if tokenizer is None else tokenizer_bos(tokenizer)
    out = {"path": str(path), "format": info.format, "dtype": dtype_name(info.dtype) if info.dtype.kind == "u"
           else str(info.dtype), "vocab_size": info.vocab_size, "splits": {}, "warnings": list(info.warnings)}
    for name, leaf in (info.splits or {"": info}).items():
        eot = eot_id if eot_id is not None else leaf.eot_id
        bos = bos_id if bos_id is not None else leaf.bos_id
        where = str(path) if Path(path).is_file() else leaf.path if not leaf.pattern else f"{leaf.path}/{leaf.pattern}"
        if leaf.format.startswith("nanogpt") and bos is None:
            bos = _find_bos(leaf, out["warnings"], known_bos)
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
            suspect = not_like_tokens(counts, info.dtype, info.vocab_size, eot, bos)
            if suspect is not None:
                rep["not_like_tokens"] = f"{where}: {suspect}"
                out["warnings"].append(rep["not_like_tokens"])
        if leaf.format in ("raw", "niels"):
            out["warnings"].extend(filter(None, [kempnerforge_note({t.path: t.count for t in leaf.token_files},
                                                                   info.dtype, where)]))
        # the path and file_pattern that open exactly this leaf from Python
        target = (leaf.path, leaf.pattern) if leaf.pattern else (leaf.path if info.splits else str(path), None)
        rep["calls"] = _calls(leaf, *target, seq_len=seq_len, eot=eot, bos=bos, dtype=dtype, counts=counts)
        if leaf.format == "kempner-npy":
            pack = " --data.pack_sequences true" if eot is not None else ""
            rep["kempnerforge"] = (f"--data.dataset_path {target[0]} --data.file_pattern "
                                   f"'{target[1] or '*.npy'}'{pack} --data.seq_len {seq_len}")
        if leaf.format == "megatron":
            rep["megatron_data_path"] = [i.prefix for i in leaf.megatron]
        out["splits"][name or "all"] = rep
    return out


def print_report(rep: dict, seq_len: int) -> None:
    print(f"{rep['path']}: {rep['format']}, {rep['dtype']}, vocab {rep['vocab_size']}")
    for name, s in rep["splits"].items():
        extra = f", max id {s['max_id']}, {s['eot_count']} EOT" if "max_id" in s else ""
        print(f"  {name}: {s['files']} file(s), {s['tokens']} tokens, {s['samples']} samples of "
              f"{seq_len}+1{extra}")
    print("\nfrom niels_gpt.formats.kempner_dataset import MemoryMappedDataset")
    print("from niels_gpt.formats.nanogpt_dataset import NanogptDataset")
    for name, s in rep["splits"].items():
        if "not_like_tokens" in s:  # never the settings to train on it without the doubt about its contents
            print(f"# WARNING: {s['not_like_tokens']}")
        print(f"# {name}: train on it with")
        for call in s["calls"]:
            print(call)
        if "kempnerforge" in s:
            print(f"# KempnerForge: {s['kempnerforge']}")
        if "megatron_data_path" in s:
            print(f"# Megatron-LM: --data-path {' '.join(s['megatron_data_path'])} --seq-length {seq_len}")
    for w in rep["warnings"]:
        print(f"warning: {w}", file=sys.stderr)
