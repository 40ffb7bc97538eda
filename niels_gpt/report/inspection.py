"""inspect: describe any output and decode a window of it through the readers training uses."""

from __future__ import annotations

import json
from itertools import groupby
from pathlib import Path

import numpy as np

from niels_gpt.constants import MANIFEST_NAME, SPLITS
from niels_gpt.errors import ConfigError
from niels_gpt.formats.receipt import read_receipt, receipt_path
from niels_gpt.locate import locate
from niels_gpt.markers import Found
from niels_gpt.meta import read_meta
from niels_gpt.packing import open_packed
from niels_gpt.packing.memmap_format import read_manifest
from niels_gpt.readers.sft_examples import SFTExamples
from niels_gpt.readers.windows_core import open_split
from niels_gpt.report.figures import table
from niels_gpt.report.found import find_caches, find_tokenizer
from niels_gpt.tokenizer import check_tokenizer_matches, load_tokenizer

TRAINED_OPEN, TRAINED_CLOSE = "⟦", "⟧"


def show_tokens(tokenizer, ids, trained=None) -> str:
    """Decode ids, wrapping trained runs in ⟦ ⟧ and naming special tokens (those that decode to no text): the
    library's four by short names (`<|eot|>`), any other by its own text (`<|im_end|>`, `<s>`)."""
    silent = np.flatnonzero(tokenizer.token_byte_lengths() == 0)
    names = {int(i): tokenizer.id_to_piece(int(i)) for i in silent}
    if tokenizer.library_conventions:
        names.update({v: f"<|{k}|>" for k, v in tokenizer.special_ids.items()})
    trained = [False] * len(ids) if trained is None else trained
    out = []
    # runs of ordinary ids decode together; a special id shows by its name
    pairs = zip(map(int, ids), trained, strict=True)
    for (name, flag), run in groupby(pairs, lambda t: (names.get(t[0]), bool(t[1]))):
        run = [tid for tid, _ in run]
        texts = [name] * len(run) if name is not None else [tokenizer.decode(run)]
        out += [f"{TRAINED_OPEN}{text}{TRAINED_CLOSE}" if flag else text for text in texts]
    return "".join(out)


def totals_table(rows: list[list]) -> str:
    """meta.json totals of one or more caches as a table: one row per cache and split."""
    out = []
    for name, kind, totals in rows:
        for split in SPLITS:
            if f"{split}_tokens" in totals:
                out.append([f"{name}/{split}" if name != "." else split, kind, totals[f"{split}_tokens"],
                            totals.get(f"{split}_examples", "-") if kind == "sft" else "-"])
    return table(["split", "kind", "tokens", "examples"], out)


def inspect_json(path: str) -> str:
    """The raw form of inspect: meta.json of each cache at or below `path`, without its file list."""
    root = Path(path)
    caches = find_caches(root) if root.exists() else []
    if not caches:
        found = locate(root)  # the one door: a missing path, an unfinished build, a text file
        if found.split is None:
            read_meta(str(root))  # packed bins or a peer's files: no meta.json of ours to show
        caches = [found.root]
    out = {str(c): {k: v for k, v in read_meta(str(c)).items() if k != "files"} for c in caches}
    return json.dumps(out, indent=2, sort_keys=True)


def inspect_path(path: str, *, tokenizer: str | None = None, window: int = 64) -> str:
    if window < 1:  # a pretraining window was shown at 2 tokens, an SFT example failed naming no flag
        raise ConfigError(f"--window {window}: must be >= 1 (the tokens to decode)")
    root = Path(path)
    caches = find_caches(root) if root.exists() else []
    if not caches:
        found = locate(root)  # the one door: raises for a missing path, an unfinished build, a text file
        if found.kind == "packed":
            return _inspect_packed(found, tokenizer, window)
        if found.kind == "foreign":
            return _inspect_foreign(root, found.info, tokenizer, window)
        if found.split is not None:  # a split directory: the cache it belongs to
            return inspect_path(str(found.root), tokenizer=tokenizer, window=window)
        read_meta(str(root))  # raises the "not a cache" error naming the path
    if len(caches) > 1 or caches[0] != root:
        lines, rows = [f"{len(caches)} cache(s) under {root}:"], []
        for c in caches:
            m, rel = read_meta(str(c)), c.relative_to(root)
            if m["kind"] == "tokenizer":
                sha = str(m["tokenizer_sha256"])[:16]
                lines.append(f"  {rel}: tokenizer, {m['vocab_size']} ids, sha256 {sha}…")
            elif m.get("built", True):
                lines.append(f"  {rel}: {m['kind']}")
                rows.append([str(rel), m["kind"], m.get("totals") or {}])
            else:
                lines.append(f"  {rel}: {m['kind']}, not built")
        if rows:
            lines += ["", totals_table(rows)]
        return "\n".join(lines)
    meta = read_meta(str(root))
    if meta["kind"] == "tokenizer":
        return "\n".join([f"tokenizer {root}", f"  vocab_size: {meta['vocab_size']}",
                          f"  tokenizer_sha256: {meta['tokenizer_sha256']}",
                          f"  special_token_ids: {meta['special_token_ids']}", f"  settings: {meta.get('settings')}"])
    head = {k: meta.get(k) for k in ("kind", "dataset_name", "dataset_config", "split_rule", "seed", "token_dtype",
                                     "vocab_size", "special_token_ids", "shard_bytes", "streaming", "totals", "skipped")}
    lines = [f"cache {root}"] + [f"  {k}: {v}" for k, v in head.items() if v is not None and k != "totals"]
    if head.get("totals"):
        lines += ["", totals_table([[".", meta["kind"], head["totals"]]]), ""]
    if meta.get("built") is False:
        return "\n".join(lines + [f"  (not built: {meta.get('reason')})"])
    lines.append(f"  files: {len(meta['files'])}, {sum(r['bytes'] for r in meta['files'].values()):,} bytes")
    tok = find_tokenizer(root, meta, tokenizer)
    if meta["kind"] == "pretrain":
        longest = {s: max((r["tokens"] for rel, r in meta["files"].items() if rel.startswith(f"{s}/")), default=0)
                   for s in SPLITS}
        order = SPLITS if meta["totals"]["train_tokens"] > window else SPLITS[::-1]
        split = next((s for s in order if longest[s] > 1), None)  # a window holds two tokens at least
        if split is None:
            return "\n".join(lines + ["", "no shard holds two tokens: no window to decode"])
        T = max(1, min(window - 1, longest[split] - 1))
        _, core = open_split(root, split, T, 1)  # the windows training reads (readers/windows_core.py)
        ids = core.gather(np.array([0]), np.array([0]))[0]
        lines += ["", f"first {len(ids)} tokens of {split}/{core.names[0]}:", show_tokens(tok, ids)]
    else:
        split = "train" if meta["totals"]["train_examples"] else "val"
        ds = SFTExamples(str(root / f"{split}_tokens.bin"), str(root / f"{split}_idx.npy"), T=window,
                         eot_id=meta["special_token_ids"]["eot"])
        ids = np.asarray(ds.example(0))
        mask = ds.trained(0)
        lines += ["", f"{split} example 0 ({len(ids)} tokens; trained targets inside {TRAINED_OPEN} {TRAINED_CLOSE}):",
                  show_tokens(tok, ids, mask)]
    return "\n".join(lines)


def _inspect_foreign(root: Path, info, tokenizer: str | None, window: int) -> str:
    lines = [f"{info.format} output {root} (no meta.json of ours: a converted or foreign token directory)",
             f"  dtype: {info.dtype.name}", f"  tokens: {info.num_tokens:,}"]
    for name, leaf in (info.splits.items() if info.splits else [("", info)]):
        label = f"  {name}: " if name else "  "
        lines.append(f"{label}{len(leaf.files)} file(s), {leaf.num_tokens:,} tokens")
    lines += [f"  {k}: {getattr(info, k)}" for k in ("eot_id", "bos_id", "vocab_size", "documents", "tokenizer_sha256")
              if getattr(info, k) is not None]
    leaf = info.leaf() if info.splits else info
    first = next((t for t in leaf.token_files if t.count), None)
    if first is None:
        return "\n".join(lines)
    ids = np.asarray(first.open()[:window]).tolist()
    recorded = info.tokenizer_sha256
    if recorded is None and receipt_path(root).is_file():
        recorded = read_receipt(receipt_path(root)).get("tokenizer_sha256")
    head = f"first {len(ids)} tokens of {Path(first.path).name}:"
    return _decoded(lines, head, ids, tokenizer, recorded, root)


def _inspect_packed(found: Found, tokenizer: str | None, window: int) -> str:
    root = found.path
    ds = open_packed(root)
    lines = [f"packed SFT bins {root} ({type(ds).__name__})", f"  bins: {len(ds):,}"]
    manifest = read_manifest(root) if found.layout == "memmap" else {}
    if found.layout == "memmap":
        lines += [f"  {k}: {manifest[k]}" for k in ("pack_size", "num_sequences", "algorithm", "packing_efficiency",
                                                     "loss_mask_convention") if k in manifest]
        if (root / "val" / MANIFEST_NAME).is_file():  # pack-sft's packed val split
            held_out = read_manifest(root / "val")
            lines.append(f"  val: {held_out['num_bins']:,} bins, {held_out['num_sequences']:,} sequences in {root / 'val'}")
    if not len(ds):
        return "\n".join(lines)
    item = ds[0]
    ids = np.asarray(item["input_ids"])[:window]
    mask = np.asarray(item["loss_mask"])[:window].astype(bool) if "loss_mask" in item else None
    head = (f"bin 0, first {len(ids)} tokens (loss_mask[j] trains the prediction of token j+1; trained "
            f"targets inside {TRAINED_OPEN} {TRAINED_CLOSE}):")
    recorded = (manifest.get("source") or {}).get("tokenizer_sha256")
    trained = None if mask is None else np.concatenate([[False], mask[:-1]])  # mark the trained targets
    return _decoded(lines, head, ids.tolist(), tokenizer, recorded, root, trained)


def _decoded(lines: list[str], head: str, ids: list[int], tokenizer: str | None, recorded: str | None,
             root: Path, trained=None) -> str:
    """`lines`, then the window under `head`: its ids, or decoded by `tokenizer` (refused when it is not the
    recorded one)."""
    if tokenizer is None:
        ids_line = " ".join(map(str, ids))
        return "\n".join(lines + ["", f"{head} (ids; pass --tokenizer PATH to decode)", ids_line])
    tok = load_tokenizer(tokenizer)
    check_tokenizer_matches(tok, recorded, root)
    return "\n".join(lines + ["", head, show_tokens(tok, ids, trained)])

