"""The shards of one split of a pretraining cache, as every reader of it takes them.

`split_shards` is the one place that lists a split: meta.json's records checked against the disk
(`niels_gpt.meta.check_files`), a shard on disk that meta.json does not list refused (left over from
another build), and the listed shards in numeric file order (shard_99999 before shard_100000). A compressed
cache lists `shard_NNNNN.bin.zst` (niels_gpt/formats/zstd_shard.py), an uncompressed one `shard_NNNNN.bin`;
a split holding both is refused.
The random-window reader (`readers/pretrain.py`) and the indexed windows (`loading/windows.py`) use it.
"""

from __future__ import annotations

from pathlib import Path

from niels_gpt.formats.base import file_order
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
