"""One split of an SFT cache opened for packing: token memmap, example offsets, special ids, provenance.

Reads `<cache>/{split}_tokens.bin`, `{split}_idx.npy` (int64 example starts) and `meta.json` (kind "sft");
the tokens stay memory-mapped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from niels_gpt.constants import META_NAME, SPLITS
from niels_gpt.errors import CacheError, ConfigError
from niels_gpt.meta import (
    TOKEN_DTYPES,
    check_files,
    check_sft_offsets,
    load_checked_npy,
    raise_on_problems,
    read_meta,
    sha256_file,
)
from niels_gpt.urls import is_url


@dataclass
class SFTSplit:
    cache_dir: Path
    split: str
    tokens: np.ndarray  # memmap, uint16/uint32
    starts: np.ndarray  # int64[n]
    lengths: np.ndarray  # int64[n]
    asst_id: int | None  # None: the cache stores its assistant mask (a chat template's rendering)
    eot_id: int
    meta: dict
    tokens_sha256: str
    meta_sha256: str
    mask: np.ndarray | None = None  # memmap of `{split}_mask.bin`, one uint8 per token (1 = trained)

    def __len__(self) -> int:
        return len(self.starts)

    def provenance(self) -> dict:
        return {"cache_dir": str(self.cache_dir), "split": self.split,
                "tokens_file": f"{self.split}_tokens.bin", "tokens_sha256": self.tokens_sha256,
                **({"mask_file": f"{self.split}_mask.bin"} if self.mask is not None else {}),
                "meta_sha256": self.meta_sha256, "dataset_name": self.meta.get("dataset_name"),
                "tokenizer_sha256": self.meta.get("tokenizer_sha256"),
                "special_token_ids": self.meta.get("special_token_ids")}


def open_sft_split(cache_dir, split: str = "train") -> SFTSplit:
    """Open one split of an SFT cache, checking meta.json, file sizes and the offsets."""
    if split not in SPLITS:
        raise ConfigError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if is_url(cache_dir):  # as a path it reads "s3:/b/c": a missing meta.json, and advice to rebuild
        raise ConfigError(f"{cache_dir}: pack-sft reads a local SFT cache, not a URL: copy the cache here first")
    cache_dir = Path(cache_dir)
    meta = read_meta(str(cache_dir))
    if meta["kind"] != "sft":
        raise CacheError(f"{cache_dir}/meta.json: kind is {meta['kind']!r}, expected 'sft'; pack-sft reads "
                         "SFT caches (built by build_sft_cache)")
    tok_name, idx_name, mask_name = f"{split}_tokens.bin", f"{split}_idx.npy", f"{split}_mask.bin"
    listed = {k: v for k, v in meta["files"].items() if k in (tok_name, idx_name, mask_name)}
    raise_on_problems(check_files(cache_dir, {"files": listed}), cache_dir)
    tok_path, idx_path = cache_dir / tok_name, cache_dir / idx_name
    for path in (tok_path, idx_path):
        if not path.is_file():
            raise CacheError(f"{path}: missing from the SFT cache; rebuild the cache")
    dtype = np.dtype(TOKEN_DTYPES[meta["token_dtype"]])
    size = tok_path.stat().st_size
    if size % dtype.itemsize:
        raise CacheError(f"{tok_path}: {size} bytes is not a multiple of {dtype.itemsize} ({meta['token_dtype']})")
    n_tokens = size // dtype.itemsize
    tokens = (np.memmap(tok_path, dtype=dtype, mode="r") if n_tokens else np.zeros(0, dtype=dtype))
    starts = load_checked_npy(idx_path, meta["files"].get(idx_name), "offsets")
    starts = check_sft_offsets(starts, n_tokens, idx_path)
    ends = np.append(starts[1:], n_tokens)
    special = meta["special_token_ids"]
    mask = None
    if special.get("asst") is None and mask_name not in meta["files"]:
        raise CacheError(f"{cache_dir}/meta.json: no assistant sentinel id and no {mask_name}; nothing says "
                         "which tokens are trained: rebuild the SFT cache")
    if mask_name in meta["files"]:  # the trained tokens as stored (a chat template's rendering), as readers take them
        mask_path = cache_dir / mask_name
        if mask_path.stat().st_size != n_tokens:
            raise CacheError(f"{mask_path}: {mask_path.stat().st_size} bytes but {tok_name} holds {n_tokens} "
                             "tokens (one mask byte each); rebuild the cache")
        mask = np.memmap(mask_path, dtype=np.uint8, mode="r") if n_tokens else np.zeros(0, np.uint8)
    tok_rec = meta["files"].get(tok_name, {})
    asst = None if special.get("asst") is None else int(special["asst"])
    return SFTSplit(cache_dir, split, tokens, starts, ends - starts, asst, int(special["eot"]),
                    meta, tok_rec.get("sha256") or sha256_file(str(tok_path)),
                    sha256_file(str(cache_dir / META_NAME)), mask)
