"""inspect and verify: look at caches through the same readers training uses.

`verify_path` walks a cache or a root of caches: every meta.json is schema-checked, every file it
lists is compared with the disk (size, token count, sha256, SFT offsets); every packed-SFT directory
(manifest.json) is opened and validated by the packing reader; a directory holding token files or
packed arrays without its meta.json / manifest.json is reported as an unfinished build.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from niels_gpt.cache.meta import META_NAME, check_files, read_meta
from niels_gpt.cache.mmap import numpy_dtype
from niels_gpt.errors import NielsGPTError, TokenizerError

TRAINED_OPEN, TRAINED_CLOSE = "⟦", "⟧"
PACKED_MANIFEST = "manifest.json"


def find_caches(path: Path) -> list[Path]:
    path = Path(path)
    if (path / META_NAME).is_file():
        return [path]
    return sorted(p.parent for p in path.rglob(META_NAME) if p.parent.name != "tokenizer")


def unfinished_dirs(path: Path) -> list[Path]:
    """Directories that hold token files but no meta.json: builds that never committed."""
    out = []
    for d in [Path(path), *[p for p in Path(path).rglob("*") if p.is_dir()]]:
        if (d / META_NAME).is_file():
            continue
        if (d / PACKED_MANIFEST).is_file():
            continue
        if any(d.glob("*_tokens.bin")) or any((d / "train").glob("shard_*.bin")) or any((d / "val").glob("shard_*.bin")):
            out.append(d)
        elif (d / "input_ids.npy").is_file() and not (d / PACKED_MANIFEST).is_file():
            out.append(d)
    return out


def verify_path(path: str) -> tuple[list[str], int]:
    root = Path(path)
    if not root.exists():
        return [f"{root}: no such file or directory"], 0
    problems = [f"{d}: token files but no {META_NAME} (or {PACKED_MANIFEST}): unfinished build, rebuild it"
                for d in unfinished_dirs(root)]
    caches = find_caches(root)
    packed = sorted(p.parent for p in ([root / PACKED_MANIFEST] if (root / PACKED_MANIFEST).is_file()
                                       else root.rglob(PACKED_MANIFEST)))
    for shard in packed:
        from niels_gpt.packing import PackedMemmapDataset

        try:
            PackedMemmapDataset(shard).validate()
        except NielsGPTError as exc:
            problems.append(str(exc))
    for cache in caches:
        try:
            meta = read_meta(str(cache))
        except NielsGPTError as exc:
            problems.append(str(exc))
            continue
        if meta.get("built") is False or meta["kind"] == "tokenizer":
            continue
        problems += check_files(cache, meta, hashes=True)
        problems += _check_counts(cache, meta)
    if not caches and not packed and not problems:
        problems.append(f"{root}: no {META_NAME} found: not a cache (or an unfinished build)")
    return problems, len(caches) + len(packed)


def _check_counts(cache: Path, meta: dict) -> list[str]:
    dtype = numpy_dtype(meta["token_dtype"])
    out = []
    for rel, rec in sorted(meta["files"].items()):
        path = cache / rel
        if not path.is_file() or path.stat().st_size != rec["bytes"]:
            continue  # already reported by check_files
        if "tokens" in rec and rec["tokens"] * dtype.itemsize != rec["bytes"]:
            out.append(f"{path}: meta says {rec['tokens']} tokens but {rec['bytes']} bytes of {dtype.name}")
        if rel.endswith("_idx.npy"):
            try:
                idx = np.load(path, allow_pickle=False)
            except (OSError, ValueError) as exc:
                out.append(f"{path}: unreadable offsets ({exc})")
                continue
            if len(idx) != rec.get("examples", len(idx)):
                out.append(f"{path}: {len(idx)} offsets, meta says {rec['examples']} examples")
            tokens = meta["files"].get(rel.replace("_idx.npy", "_tokens.bin"), {}).get("tokens")
            if len(idx) and (idx[0] != 0 or (np.diff(idx) <= 0).any() or (tokens is not None and idx[-1] >= tokens)):
                out.append(f"{path}: offsets are not 0, strictly increasing and inside the token file")
    return out


def find_tokenizer(cache: Path, meta: dict, explicit: str | None = None):
    from niels_gpt.tokenizer import load_tokenizer

    if explicit:
        return load_tokenizer(explicit)
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


def inspect_path(path: str, *, tokenizer: str | None = None, window: int = 64) -> str:
    root = Path(path)
    caches = find_caches(root)
    if not caches:
        read_meta(str(root))  # raises the "unfinished build" error
    if len(caches) > 1 or caches[0] != root:
        lines = [f"{len(caches)} cache(s) under {root}:"]
        for c in caches:
            m = read_meta(str(c))
            lines.append(f"  {c.relative_to(root)}: {m['kind']}, " + (json.dumps(m.get("totals")) if m.get("built", True) else "not built"))
        return "\n".join(lines)
    meta = read_meta(str(root))
    head = {k: meta.get(k) for k in ("kind", "dataset_name", "dataset_config", "split_rule", "seed", "token_dtype",
                                     "vocab_size", "special_token_ids", "shard_bytes", "streaming", "totals", "skipped")}
    lines = [f"cache {root}"] + [f"  {k}: {v}" for k, v in head.items() if v is not None]
    if meta.get("built") is False:
        return "\n".join(lines + [f"  (not built: {meta.get('reason')})"])
    lines.append(f"  files: {len(meta['files'])}, {sum(r['bytes'] for r in meta['files'].values()):,} bytes")
    tok = find_tokenizer(root, meta, tokenizer)
    if meta["kind"] == "pretrain":
        from niels_gpt.cache.pretrain_dataset import PretrainTokenStreamDataset

        split = "train" if meta["totals"]["train_tokens"] > window else "val"
        ds = PretrainTokenStreamDataset(str(root / split), T=max(1, min(window - 1, ds_max(meta, split))), device="cpu")
        ids = ds.gather(np.array([0]), np.array([0]))[0]
        lines += ["", f"first {len(ids)} tokens of {split}/{ds.shard_names[0]}:", show_tokens(tok, ids)]
    else:
        from niels_gpt.cache.sft_dataset import SFTExampleDataset, assistant_span_mask

        split = "train" if meta["totals"]["train_examples"] else "val"
        ds = SFTExampleDataset(str(root / f"{split}_tokens.bin"), str(root / f"{split}_idx.npy"), T=window,
                               device="cpu", eot_id=meta["special_token_ids"]["eot"])
        ids = np.asarray(ds.example(0))
        mask = assistant_span_mask(ids, ds.asst_id, ds.eot_id)
        lines += ["", f"{split} example 0 ({len(ids)} tokens; trained targets inside {TRAINED_OPEN} {TRAINED_CLOSE}):",
                  show_tokens(tok, ids, mask)]
    return "\n".join(lines)


def ds_max(meta: dict, split: str) -> int:
    tokens = [r["tokens"] for rel, r in meta["files"].items() if rel.startswith(f"{split}/")]
    return max(1, max(tokens) - 1)
