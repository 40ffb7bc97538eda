"""inspect and verify: look at every output of the library through the same readers training uses.

`verify_path` walks a cache or a root of caches: every meta.json is schema-checked, every file it
lists is compared with the disk (size, token count, sha256, SFT offsets); every packed-SFT directory
(manifest.json) is opened and validated by the packing reader; packed Parquet is read bin by bin; a
converted output in a peer format (nanoGPT, KempnerForge, Megatron, raw + metadata.yaml) is opened by
its format's reader (every header and size) and its ids are checked against the recorded vocabulary.
A directory holding our token files or packed arrays without meta.json / manifest.json is reported as
an unfinished build. `inspect_path` describes any of them and decodes a window.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from niels_gpt.errors import NielsGPTError, TokenizerError
from niels_gpt.formats.detect import detect_format
from niels_gpt.formats.receipt import check_receipt, read_receipt, receipt_path
from niels_gpt.formats.zstd_shard import verify_compressed
from niels_gpt.meta import META_NAME, check_files, read_meta, record_problem, sft_offsets_problem, sha256_file
from niels_gpt.packing import PackedMemmapDataset, open_packed
from niels_gpt.packing.factory import PARQUET_SUFFIXES
from niels_gpt.packing.memmap_format import FORMAT_NAME, read_manifest
from niels_gpt.readers.pretrain import PretrainTokenStreamDataset
from niels_gpt.readers.sft import SFTExampleDataset
from niels_gpt.tables import table
from niels_gpt.tokenizer import check_tokenizer_matches, load_tokenizer

TRAINED_OPEN, TRAINED_CLOSE = "⟦", "⟧"
PACKED_MANIFEST = "manifest.json"


def find_caches(path: Path) -> list[Path]:
    """Every directory with a meta.json at or below `path`: caches and tokenizer directories."""
    path = Path(path)
    if (path / META_NAME).is_file():
        return [path]
    return sorted(p.parent for p in path.rglob(META_NAME))


def _check_special_ids(cache: Path, meta: dict) -> list[str]:
    """The special ids meta.json records must be those of the tokenizer it names (when that tokenizer is found)."""
    try:
        tok = find_tokenizer(cache, meta)
    except NielsGPTError:
        return []  # no tokenizer with the recorded sha256 near the cache: nothing to compare with
    theirs = {k: v for k, v in tok.special_ids.items() if k in meta["special_token_ids"]}
    ours = {k: meta["special_token_ids"][k] for k in theirs}
    if ours != theirs:
        return [f"{cache / META_NAME}: special_token_ids {ours} but the tokenizer it was built with has {theirs}; "
                "the meta.json was edited or damaged: rebuild the cache"]
    return []


def _stray_files(directory: Path, listed: set[str], marker: str = META_NAME) -> list[str]:
    """Files inside an output that its metadata does not list: temporaries of a killed run, leftovers."""
    stray = []
    for p in sorted(directory.rglob("*")):
        rel = p.relative_to(directory).as_posix()
        if p.is_dir() or rel == marker or rel in listed:
            continue
        if any((directory / parent / META_NAME).is_file() for parent in Path(rel).parents if str(parent) != "."):
            continue  # a nested output of its own, checked on its own
        stray.append(f"{p}: a file the {marker} does not list (a temporary of a killed run or a leftover); "
                     "remove it or rebuild")
    return stray


def _check_tokenizer(directory: Path, meta: dict) -> list[str]:
    model = directory / str(meta.get("model_file", "spm.model"))
    if not model.is_file():
        return [f"{model}: missing (its meta.json records the model's sha256)"]
    digest = sha256_file(str(model))
    if digest != meta["tokenizer_sha256"]:
        return [f"{model}: sha256 {digest[:16]}… differs from meta {str(meta['tokenizer_sha256'])[:16]}…: the model "
                "changed after training; every cache built with it names the recorded sha256"]
    return []


def unfinished_dirs(path: Path) -> list[Path]:
    """Directories that hold token files but no meta.json: builds that never committed.

    A directory that a foreign-format reader recognises (a `convert` output: nanoGPT, KempnerForge,
    Megatron, raw with metadata.yaml) is a finished output of its own format, not an unfinished build.
    """
    out = []
    for d in [Path(path), *[p for p in Path(path).rglob("*") if p.is_dir()]]:
        if (d / META_NAME).is_file() or (d / PACKED_MANIFEST).is_file():
            continue
        if any(d.glob("*_tokens.bin")) or any((d / "train").glob("shard_*.bin")) or any((d / "val").glob("shard_*.bin")):
            if foreign_output(d) is None:
                out.append(d)
        elif (d / "input_ids.npy").is_file():
            out.append(d)
    return out


def foreign_output(path: Path):
    """The FormatInfo of `path` when it is a token output in a peer format (no meta.json of ours), else None."""
    path = Path(path)
    if (path / META_NAME).is_file() or (path / PACKED_MANIFEST).is_file():
        return None
    try:
        info = detect_format(path)
    except NielsGPTError:
        return None
    return None if info.format == "niels" else info


def is_packed_parquet(path: Path) -> bool:
    path = Path(path)
    if path.is_file():
        return path.suffix in PARQUET_SUFFIXES
    return path.is_dir() and any(c.suffix in PARQUET_SUFFIXES for c in path.iterdir())


def verify_path(path: str) -> tuple[list[str], int]:
    """(problems, outputs checked) for a cache, a root of caches, a packed directory or a converted output."""
    problems, checked, _ = verify_outputs(path)
    return problems, checked


def verify_outputs(path: str) -> tuple[list[str], int, list[str]]:
    """verify_path, plus one line per output checked naming what it is."""
    root = Path(path)
    if not root.exists() and not megatron_prefix(root):
        return [f"{root}: no such file or directory"], 0, []
    caches = find_caches(root) if root.exists() else []
    packed = sorted(p.parent for p in ([root / PACKED_MANIFEST] if (root / PACKED_MANIFEST).is_file()
                                       else root.rglob(PACKED_MANIFEST) if root.is_dir() else []))
    if not caches and not packed and root.is_dir() and receipt_path(root).is_file():
        try:
            info = detect_format(root)
        except NielsGPTError as exc:  # a converted output its reader refuses: say why, and what changed
            return [str(exc), *check_receipt(receipt_path(root))[1]], 1, []
    if not caches and not packed:
        info = foreign_output(root)
        if info is not None:
            return _verify_foreign(root, info)
        if is_packed_parquet(root):
            return _verify_packed_parquet(root)
    problems = [f"{d}: token files but no {META_NAME} (or {PACKED_MANIFEST}): unfinished build, rebuild it"
                for d in unfinished_dirs(root)]
    seen = []
    for shard in packed:
        seen.append(f"{shard}: packed SFT bins ({FORMAT_NAME})")
        try:
            ds = PackedMemmapDataset(shard)
            ds.validate()
            problems += _stray_files(shard, {rec["name"] for rec in ds.manifest["files"].values()}, PACKED_MANIFEST)
        except NielsGPTError as exc:
            problems.append(str(exc))
    for cache in caches:
        try:
            meta = read_meta(str(cache))
        except NielsGPTError as exc:
            problems.append(str(exc))
            continue
        seen.append(f"{cache}: {meta['kind']} cache")
        if meta["kind"] == "tokenizer":
            problems += _check_tokenizer(cache, meta)
            problems += _stray_files(cache, {str(meta.get("model_file", "spm.model"))})
            continue
        if meta.get("built") is False:
            continue
        found = check_files(cache, meta, hashes=True)
        named = {line.split(": ", 1)[0] for line in found}
        problems += found + [line for line in _check_counts(cache, meta) if line.split(": ", 1)[0] not in named]
        problems += _check_special_ids(cache, meta)
        problems += _stray_files(cache, set(meta["files"]))
        problems += verify_compressed(cache, meta)
    if not caches and not packed and not problems:
        problems.append(f"{root}: no {META_NAME}, {PACKED_MANIFEST} or token files of a known format found: "
                        "not a cache, a packed directory or a converted output")
    return problems, len(caches) + len(packed), seen


def megatron_prefix(path: Path) -> bool:
    return Path(str(path) + ".bin").is_file() and Path(str(path) + ".idx").is_file()


def _verify_foreign(root: Path, info) -> tuple[list[str], int, list[str]]:
    """A converted output: every header and size was checked by detect_format; here every token is
    read once and checked against the vocabulary its metadata records."""
    problems = []
    leaves = list(info.splits.values()) if info.splits else [info]
    for leaf in leaves:
        vocab = leaf.vocab_size
        for tf in leaf.token_files:
            if vocab is None or tf.count == 0:
                continue
            top = int(tf.open().max())
            if top >= vocab:
                problems.append(f"{tf.path}: token id {top} >= vocab_size {vocab} recorded in its metadata: "
                                "the file or its metadata is corrupt; re-run convert")
    kind = f"{info.format} ({info.dtype.name}, {info.num_tokens:,} tokens in {len(info.files)} file(s))"
    note = "" if any(leaf.vocab_size for leaf in leaves) else "; no vocab_size recorded, ids not range-checked"
    receipt = receipt_path(root) if root.exists() else None
    if receipt is not None and receipt.is_file():
        _, found = check_receipt(receipt)
        problems += found
        note += f"; every file's sha256 checked against {receipt.name}"
    else:
        note += "; no receipt (not written by convert): no checksums to compare"
    return problems, 1, [f"{root}: {kind}: headers and sizes checked{note}"]


def _verify_packed_parquet(root: Path) -> tuple[list[str], int, list[str]]:
    try:
        ds = open_packed(root)
        for i in range(len(ds)):
            ds[i]
    except NielsGPTError as exc:
        return [str(exc)], 1, []
    return [], 1, [f"{root}: packed SFT Parquet, {len(ds):,} bins read"]


def _check_counts(cache: Path, meta: dict) -> list[str]:
    """What the contents of well-sized files say against meta.json (offsets, counts); a file that
    check_files already reported (say, its sha256) is reported once, by that."""
    out = []
    for rel, rec in sorted(meta["files"].items()):
        path = cache / rel
        if record_problem(rec) is not None or not path.is_file() or path.stat().st_size != rec["bytes"]:
            continue  # already reported by check_files
        if rel.endswith("_idx.npy"):
            try:
                idx = np.load(path, allow_pickle=False)
            except Exception as exc:  # numpy raises ValueError, SyntaxError or TokenError on a damaged header
                out.append(f"{path}: unreadable offsets ({type(exc).__name__}: {exc})")
                continue
            if len(idx) != rec.get("examples", len(idx)):
                out.append(f"{path}: {len(idx)} offsets, meta says {rec['examples']} examples")
            tokens = meta["files"].get(rel.replace("_idx.npy", "_tokens.bin"), {}).get("tokens")
            problem = sft_offsets_problem(idx, tokens)
            if problem is not None:
                out.append(f"{path}: {problem}")
    return out


def find_tokenizer(cache: Path, meta: dict, explicit: str | None = None):
    if explicit:
        tok = load_tokenizer(explicit)
        check_tokenizer_matches(tok, meta.get("tokenizer_sha256"), cache)
        return tok
    for parent in [cache, *cache.parents]:
        cand = parent / "tokenizer"
        if (cand / META_NAME).is_file():
            tok = load_tokenizer(cand)
            if tok.sha256 == meta.get("tokenizer_sha256"):
                return tok
    raise TokenizerError(f"no tokenizer with sha256 {str(meta.get('tokenizer_sha256'))[:16]}… found above {cache}: "
                         "pass --tokenizer PATH")


def show_tokens(tokenizer, ids, trained=None) -> str:
    """Decode ids, naming special tokens and wrapping trained runs in ⟦ ⟧."""
    names = {v: f"<|{k}|>" for k, v in tokenizer.special_ids.items()}
    trained = [False] * len(ids) if trained is None else list(trained)
    out, run, run_flag = [], [], None

    def flush():
        if run:
            text = tokenizer.decode(run)
            out.append(f"{TRAINED_OPEN}{text}{TRAINED_CLOSE}" if run_flag else text)
            run.clear()

    for tid, flag in zip((int(i) for i in ids), trained, strict=True):
        if tid in names:
            flush()
            out.append(f"{TRAINED_OPEN}{names[tid]}{TRAINED_CLOSE}" if flag else names[tid])
            continue
        if flag != run_flag:
            flush()
            run_flag = flag
        run.append(tid)
    flush()
    return "".join(out)


def totals_table(rows: list[list]) -> str:
    """meta.json totals of one or more caches as a table: one row per cache and split."""
    out = []
    for name, kind, totals in rows:
        for split in ("train", "val"):
            if f"{split}_tokens" in totals:
                out.append([f"{name}/{split}" if name != "." else split, kind, totals[f"{split}_tokens"],
                            totals.get(f"{split}_examples", "-") if kind == "sft" else "-"])
    return table(["split", "kind", "tokens", "examples"], out)


def inspect_json(path: str) -> str:
    """The raw form of inspect: meta.json of each cache at or below `path`, without its file list."""
    root = Path(path)
    caches = find_caches(root) if root.exists() else []
    if not caches:
        read_meta(str(root))  # raises the "not a cache" error naming the path
    out = {str(c): {k: v for k, v in read_meta(str(c)).items() if k != "files"} for c in caches}
    return json.dumps(out, indent=2, sort_keys=True)


def inspect_path(path: str, *, tokenizer: str | None = None, window: int = 64) -> str:
    root = Path(path)
    caches = find_caches(root) if root.exists() else []
    if not caches:
        if (root / PACKED_MANIFEST).is_file() or is_packed_parquet(root):
            return _inspect_packed(root, tokenizer, window)
        info = foreign_output(root)
        if info is not None:
            return _inspect_foreign(root, info, tokenizer, window)
        read_meta(str(root))  # raises the "unfinished build" error
    if len(caches) > 1 or caches[0] != root:
        lines = [f"{len(caches)} cache(s) under {root}:"]
        for c in caches:
            m = read_meta(str(c))
            if m["kind"] == "tokenizer":
                lines.append(f"  {c.relative_to(root)}: tokenizer, {m['vocab_size']} ids, sha256 "
                             f"{str(m['tokenizer_sha256'])[:16]}…")
                continue
            lines.append(f"  {c.relative_to(root)}: {m['kind']}" + ("" if m.get("built", True) else ", not built"))
        rows = [[str(c.relative_to(root)), m["kind"], m.get("totals") or {}] for c in caches
                for m in [read_meta(str(c))] if m["kind"] != "tokenizer" and m.get("built", True)]
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
        split = "train" if meta["totals"]["train_tokens"] > window else "val"
        ds = PretrainTokenStreamDataset(str(root / split), T=max(1, min(window - 1, ds_max(meta, split))), device="cpu")
        ids = ds.gather(np.array([0]), np.array([0]))[0]
        lines += ["", f"first {len(ids)} tokens of {split}/{ds.shard_names[0]}:", show_tokens(tok, ids)]
    else:
        split = "train" if meta["totals"]["train_examples"] else "val"
        ds = SFTExampleDataset(str(root / f"{split}_tokens.bin"), str(root / f"{split}_idx.npy"), T=window,
                               device="cpu", eot_id=meta["special_token_ids"]["eot"])
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
    for key in ("eot_id", "bos_id", "vocab_size", "documents", "tokenizer_sha256"):
        if getattr(info, key) is not None:
            lines.append(f"  {key}: {getattr(info, key)}")
    leaf = info.leaf() if info.splits else info
    first = next((t for t in leaf.token_files if t.count), None)
    if first is None:
        return "\n".join(lines)
    ids = np.asarray(first.open()[:window]).tolist()
    head = f"first {len(ids)} tokens of {Path(first.path).name}:"
    if tokenizer is None:
        return "\n".join(lines + ["", f"{head} (ids; pass --tokenizer PATH to decode)", " ".join(map(str, ids))])
    tok = load_tokenizer(tokenizer)
    recorded = info.tokenizer_sha256
    if recorded is None and receipt_path(root).is_file():
        recorded = read_receipt(receipt_path(root)).get("tokenizer_sha256")
    check_tokenizer_matches(tok, recorded, root)
    return "\n".join(lines + ["", head, show_tokens(tok, ids)])


def _inspect_packed(root: Path, tokenizer: str | None, window: int) -> str:
    ds = open_packed(root)
    lines = [f"packed SFT bins {root} ({type(ds).__name__})", f"  bins: {len(ds):,}"]
    if (root / PACKED_MANIFEST).is_file():
        manifest = read_manifest(root)
        for key in ("pack_size", "num_sequences", "algorithm", "packing_efficiency", "loss_mask_convention"):
            if key in manifest:
                lines.append(f"  {key}: {manifest[key]}")
    if not len(ds):
        return "\n".join(lines)
    item = ds[0]
    ids = np.asarray(item["input_ids"])[:window]
    mask = np.asarray(item["loss_mask"])[:window].astype(bool) if "loss_mask" in item else None
    head = f"bin 0, first {len(ids)} tokens (loss_mask[j] trains the prediction of token j+1):"
    if tokenizer is None:
        return "\n".join(lines + ["", f"{head} ids; pass --tokenizer PATH to decode", " ".join(map(str, ids.tolist()))])
    tok = load_tokenizer(tokenizer)
    if (root / PACKED_MANIFEST).is_file():
        check_tokenizer_matches(tok, (read_manifest(root).get("source") or {}).get("tokenizer_sha256"), root)
    trained = None if mask is None else np.concatenate([[False], mask[:-1]])  # mark the trained targets
    return "\n".join(lines + ["", head + f" trained targets inside {TRAINED_OPEN} {TRAINED_CLOSE}",
                               show_tokens(tok, ids, trained)])


def ds_max(meta: dict, split: str) -> int:
    tokens = [r["tokens"] for rel, r in meta["files"].items() if rel.startswith(f"{split}/")]
    return max(1, max(tokens) - 1)
