"""The door to every token format we read: `detect_format(path, dtype=None)` says what a file or directory is.

Our pretraining cache (build, or `convert --to niels`): `<out>/{train,val}/shard_NNNNN.bin` raw little-endian
tokens of meta["token_dtype"] (formats/raw.py), then `<out>/meta.json`, the commit marker. Every document ends
with one EOT and may run on into the next shard (shards are read in name order as one stream).

Besides our cache (root, split or one shard) it opens nanoGPT header shards, KempnerForge `.npy` dirs, raw
`.bin` dirs and Megatron `.bin`/`.idx` pairs; a directory whose `train/` and `val/` hold one of those is a
root with two splits. Every header and size is checked by the format's reader. A headerless `.bin`'s dtype
comes from our meta.json, a tatm metadata.yaml or the caller, never from its size.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from niels_gpt.constants import META_NAME, SPLITS, TOKEN_DTYPES
from niels_gpt.errors import CacheMismatchError, FormatError
from niels_gpt.formats import kempner, megatron, nanogpt
from niels_gpt.formats.base import TokenFile, file_order, parse_dtype
from niels_gpt.formats.npy import open_npy
from niels_gpt.formats.raw import open_raw
from niels_gpt.formats.zstd_shard import SUFFIX, is_compressed_meta, open_compressed
from niels_gpt.meta import read_meta, stray_files_error

SHARD_GLOB = "shard_*.bin"
EMPTY = "empty"  # a split directory with no tokens (only its metadata.yaml)
FORMATS = ("niels", "nanogpt", "nanogpt-legacy", "kempner-npy", "raw", "megatron")
TEXT_INPUTS = (".txt", ".md", ".raw", ".jsonl", ".json", ".gz", ".zst", ".csv", ".arrow")  # what `build` reads


@dataclass
class FormatInfo:
    """What a token file or directory is. A root (`splits` non-empty) has no token files itself."""

    format: str
    dtype: np.dtype
    num_tokens: int
    files: list[str]
    path: str
    token_files: list[TokenFile] = field(default_factory=list)
    splits: dict[str, FormatInfo] = field(default_factory=dict)
    eot_id: int | None = None
    bos_id: int | None = None
    vocab_size: int | None = None
    tokenizer_sha256: str | None = None
    special_token_ids: dict | None = None
    documents: int | None = None
    meta: dict | None = None
    megatron: list = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    pattern: str | None = None  # a split of a flat directory: the glob of its files inside `path`

    def leaf(self, split: str | None = None) -> FormatInfo:
        """This info if it is a single stream, else its `split` (train by default)."""
        if not self.splits:
            return self
        name = split or "train"
        if name not in self.splits:
            raise FormatError(f"{self.path}: no split {name!r}; it has {sorted(self.splits)}")
        return self.splits[name]


def _root(path, splits: dict[str, FormatInfo], first: FormatInfo, **known) -> FormatInfo:
    """A root of two splits, described by its `first` split and what else is `known` of it."""
    return FormatInfo(first.format, first.dtype, sum(i.num_tokens for i in splits.values()),
                      [f for i in splits.values() for f in i.files], str(path), splits=splits,
                      eot_id=first.eot_id, bos_id=first.bos_id, vocab_size=first.vocab_size, **known)


def _niels_leaf(root: Path, meta: dict, split: str, only: list[Path] | None = None) -> FormatInfo:
    dtype = np.dtype(TOKEN_DTYPES[meta["token_dtype"]])
    compressed = is_compressed_meta(meta)  # shard_NNNNN.bin.zst (formats/zstd_shard.py)
    glob = SHARD_GLOB + SUFFIX if compressed else SHARD_GLOB
    files = only if only is not None else sorted((root / split).glob(glob), key=file_order)
    listed = meta.get("files", {})
    tfs = []
    for f in files:
        tf = None if compressed else open_raw(f, dtype)
        rec = listed.get(f"{split}/{f.name}")
        if rec is None:
            raise stray_files_error(f.parent, [f.name], root)
        tf = tf or open_compressed(f, dtype, rec, meta)
        if rec.get("bytes") != f.stat().st_size:
            raise CacheMismatchError(f"{f}: {f.stat().st_size} bytes, {root / META_NAME} says {rec.get('bytes')}: "
                              "truncated or overwritten; rebuild the cache")
        tfs.append(tf)
    missing = sorted(set(k for k in listed if k.startswith(split + "/")) - {f"{split}/{f.name}" for f in files})
    if only is None and missing:
        raise CacheMismatchError(f"{root / split}: files listed in meta.json are missing: {', '.join(missing)}")
    sep = meta.get("document_separator") or {}
    special = meta.get("special_token_ids") or {}
    docs = (meta.get("totals") or {}).get(f"{split}_documents") if only is None else None
    # NOTE: bos_id stays None: our documents are framed by EOT alone; the tokenizer's <s> id never
    # occurs in the stream, and aligning windows to it would find no window at all.
    return FormatInfo("niels", dtype, sum(t.count for t in tfs), [t.path for t in tfs], str(root / split),
                      tfs, eot_id=sep.get("id", special.get("eot")),
                      vocab_size=meta.get("vocab_size"), tokenizer_sha256=meta.get("tokenizer_sha256"),
                      special_token_ids=dict(special), documents=docs, meta=meta)


def _niels(path: Path, meta_root: Path, only: list[Path] | None = None) -> FormatInfo:
    meta = read_meta(str(meta_root))
    if meta.get("kind") != "pretrain":
        raise FormatError(f"{meta_root}: a {meta.get('kind')!r} cache, not a pretraining token stream; "
                          "formats and converters read pretraining caches")
    if path == meta_root:
        splits = {s: _niels_leaf(meta_root, meta, s) for s in SPLITS if (meta_root / s).is_dir()}
        if not splits:
            raise FormatError(f"{meta_root}: meta.json but no train/ or val/ directory; rebuild the cache")
        first = next(iter(splits.values()))
        return _root(path, splits, first, tokenizer_sha256=first.tokenizer_sha256,
                     special_token_ids=first.special_token_ids, meta=meta)
    split = path.name if only is None else path.parent.name
    return _niels_leaf(meta_root, meta, split, only)


def _tatm(directory: Path, info: FormatInfo) -> FormatInfo:
    if md := kempner.read_metadata(directory):
        info.meta, info.vocab_size, info.eot_id, info.bos_id = md, md.get("vocab_size"), md.get("eos_token_id"), \
            md.get("bos_token_id")
        info.tokenizer_sha256 = None if md.get("tokenizer_sha256") is None else str(md["tokenizer_sha256"])
    return info


def _foreign_files(files: list[Path], where: Path, dtype) -> FormatInfo:
    """Files of one directory, all of one format."""
    files = [f for f in files if not f.name.endswith(".bos.idx")]
    if not files and (where / kempner.METADATA_NAME).is_file():
        # an empty split that a writer of ours committed (its metadata.yaml says so)
        md = kempner.read_metadata(where)
        return _tatm(where, FormatInfo(EMPTY, parse_dtype(dtype or md.get("dtype") or "uint16"), 0, [], str(where)))
    if not files:
        raise FormatError(f"{where}: no token files (.npy, .bin, .idx) found")
    kinds = set()
    for f in files:
        if megatron.is_megatron(f):
            kinds.add("megatron")
        elif f.suffix == ".idx":
            raise FormatError(f"{f}: an .idx without the Megatron magic {megatron.MAGIC!r}; "
                              "not a Megatron index (remove it or re-write the pair)")
        elif f.suffix == ".npy":
            kinds.add("kempner-npy")
        elif nanogpt.is_nanogpt(f):
            kinds.add("nanogpt")
        else:
            kinds.add("raw")
    if len(kinds) > 1:
        raise FormatError(f"{where}: mixes formats {sorted(kinds)}; keep one format per directory")
    kind, extra = kinds.pop(), {}
    if kind == "megatron":
        idxs = [megatron.read_index(p) for p in sorted({megatron.prefix_of(f) for f in files})]
        tfs = [i.token_file() for i in idxs]
        extra = {"documents": sum(len(i.doc_indices) - 1 for i in idxs), "megatron": idxs}
    elif kind == "kempner-npy":
        tfs = [open_npy(f) for f in files]
    elif kind == "nanogpt":
        tfs = [nanogpt.open_nanogpt(f) for f in files]
        magics = {nanogpt.read_header(f).legacy for f in files}
        if len(magics) > 1:
            raise FormatError(f"{where}: mixes legacy and new nanoGPT headers; convert them to one")
        kind = "nanogpt-legacy" if magics.pop() else "nanogpt"
    else:
        md = kempner.read_metadata(files[0].parent)
        declared = dtype if dtype is not None else (md or {}).get("dtype")
        if declared is None:
            raise FormatError(f"{files[0]}: a headerless .bin does not record its dtype, and there is no meta.json or "
                              "metadata.yaml beside it; pass the dtype (--dtype uint16|uint32, or dtype='uint16' in "
                              "Python). Sizes divisible by 4 are NOT proof of uint32")
        tfs = [open_raw(f, declared) for f in files]
    _one_dtype(tfs, where)
    info = FormatInfo(kind, tfs[0].dtype, sum(t.count for t in tfs), [t.path for t in tfs], str(where), tfs, **extra)
    if dtype is not None and kind != "raw" and parse_dtype(dtype) != info.dtype:
        info.warnings.append(f"{where}: the dtype given ({dtype}) is ignored: the files record {info.dtype.name}")
    return _tatm(files[0].parent, info)


def _one_dtype(tfs: list, where) -> None:
    dtypes = {t.dtype for t in tfs}
    if len(dtypes) > 1:
        raise FormatError(f"{where}: files of different dtypes {sorted(str(d) for d in dtypes)}")


_SPLIT_WORD = re.compile(r"(?:^|[_.-])(train|val)(?=[_.-]|\d|$)")


def _named_splits(files: list[Path]) -> dict[str, list[Path]] | None:
    """modded-nanogpt's folder: fineweb_val_*.bin beside fineweb_train_*.bin -> {train: [...], val: [...]}, when
    every file names exactly one of train/val and both occur; otherwise None (one stream)."""
    groups: dict[str, list[Path]] = {}
    for f in files:
        words = set(_SPLIT_WORD.findall(f.stem))
        if len(words) != 1:
            return None
        groups.setdefault(words.pop(), []).append(f)
    return groups if set(groups) == set(SPLITS) else None


def _split_pattern(directory: Path, files: list[Path]) -> str | None:
    """A glob matching exactly `files` in `directory` (the last run of digits becomes '*'), else None."""
    patterns = {re.sub(r"\d+(?=\D*$)", "*", f.name) for f in files}
    if len(patterns) != 1:
        return None
    pattern = patterns.pop()
    return pattern if sorted(directory.glob(pattern)) == sorted(files) else None


def _flat_splits(directory: Path, named: dict[str, list[Path]], dtype) -> FormatInfo:
    splits = {}
    for name in SPLITS:
        leaf = _foreign_files(named[name], directory, dtype)
        leaf.pattern = _split_pattern(directory, named[name])
        splits[name] = leaf
    kinds = {i.format for i in splits.values()}
    if len(kinds) > 1:
        raise FormatError(f"{directory}: its train and val files are in different formats {sorted(kinds)}")
    first = splits["train"]
    return _root(directory, splits, first, tokenizer_sha256=first.tokenizer_sha256, meta=first.meta)


def detect_format(path: str | os.PathLike, dtype=None, *, pattern: str | None = None) -> FormatInfo:
    """Open a token file or directory of any supported format; see the module docstring."""
    p = Path(path)
    if not p.exists():
        if megatron.is_megatron(p):  # a Megatron prefix: `meg/tokens` for meg/tokens.bin + meg/tokens.idx
            info = _foreign_files([Path(str(p) + ".bin"), Path(str(p) + ".idx")], p.parent, dtype)
            info.path = str(p)
            return info
        raise FormatError(f"{p}: no such file or directory")
    if p.is_dir():
        if (p / META_NAME).is_file():
            return _niels(p, p)
        if (p.parent / META_NAME).is_file() and p.name in SPLITS:
            return _niels(p, p.parent)
        if pattern is not None:
            return _foreign_files(kempner.list_token_files(p, pattern), p, dtype)
        files = [f for f in sorted(p.iterdir()) if f.is_file() and f.suffix in (".bin", ".npy", ".idx")
                 and not f.name.endswith(".bos.idx")]
        if files:
            if any(f.suffix == ".idx" for f in files):
                files = [f for f in files if f.suffix in (".bin", ".idx")]
            else:
                files = kempner.list_token_files(p)
                named = _named_splits(files)
                if named:
                    return _flat_splits(p, named, dtype)
            return _foreign_files(files, p, dtype)
        splits = {s: detect_format(p / s, dtype) for s in SPLITS if (p / s).is_dir()}
        if not splits and (p / kempner.METADATA_NAME).is_file():
            return _foreign_files([], p, dtype)
        if not splits:
            raise FormatError(f"{p}: no token files and no train/ or val/ directories; "
                              "nothing to read here")
        kinds = {i.format for i in splits.values()} - {EMPTY}
        if len(kinds) > 1:
            raise FormatError(f"{p}: its splits are in different formats {sorted(kinds)}")
        first = max(splits.values(), key=lambda i: i.format != EMPTY)
        for i in splits.values():
            i.format = first.format if i.format == EMPTY else i.format
        return _root(p, splits, first)
    if p.suffix == ".bin" and (p.parent.parent / META_NAME).is_file() and p.parent.name in SPLITS:
        return _niels(p, p.parent.parent, only=[p])
    if p.name.endswith(TEXT_INPUTS) and not p.name.endswith(".bin.zst"):
        raise FormatError(f"{p}: a text file, not a token cache: build one from it first (`build {p} --out "
                          "cache/NAME --tokenizer TOK`), then point at cache/NAME")
    return _foreign_files([p], p.parent, dtype)
