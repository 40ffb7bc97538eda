"""The shards of one split of a pretraining cache, as every reader of it takes them.

`split_shards` lists a split once: meta.json's records checked against the disk, a shard on disk that
meta.json does not list refused, the listed shards in numeric file order (`shard_NNNNN.bin`, or `.bin.zst`
for a compressed cache).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from niels_gpt.formats.base import file_order
from niels_gpt.formats.zstd_shard import ZstdShard, frame_tokens_of
from niels_gpt.meta import COMPRESSED_SUFFIX, check_files, raise_on_problems, stray_files_error


def split_shards(cache_dir: Path, meta: dict, split: str, *, remote: bool = False) -> list[tuple[str, dict]]:
    """[(shard file name, its meta.json record)] of `split`, checked; `remote`: files not mirrored yet
    are not a problem (each is fetched, and checked, on first use)."""
    prefix = f"{split}/"
    suffix = ".bin" + COMPRESSED_SUFFIX if meta.get("compression") is not None else ".bin"
    listed = {rel[len(prefix):]: rec for rel, rec in meta["files"].items()
              if rel.startswith(prefix) and rel.endswith(suffix)}
    problems = check_files(cache_dir, meta, only=split)
    if remote:
        problems = [p for p in problems if ": missing (meta lists" not in p]
    raise_on_problems(problems, cache_dir)
    directory = cache_dir / split
    extra = sorted({p.name for p in directory.glob("shard_*.bin*") if p.name.endswith((".bin", ".bin.zst"))}
                   - set(listed))
    if extra:
        raise stray_files_error(directory, extra, cache_dir)
    return [(name, listed[name]) for name in sorted(listed, key=file_order)]


def shard_array(path: Path, meta: dict, rec: dict, dtype: np.dtype):
    """All the tokens of one shard of a pretraining cache: a memory map of a raw shard, the decompressed tokens
    of a compressed one (`.bin.zst`, checked frame by frame). For readers that scan whole shards (stats)."""
    if not str(path).endswith(COMPRESSED_SUFFIX):
        return np.memmap(path, dtype=dtype, mode="r") if Path(path).stat().st_size else np.zeros(0, dtype)
    shard = ZstdShard(path, dtype, tokens=rec["tokens"], frame_tokens=frame_tokens_of(meta, path),
                      expected_bytes=rec["bytes"], frames=rec.get("frames"))
    return shard.read(0, shard.tokens)
