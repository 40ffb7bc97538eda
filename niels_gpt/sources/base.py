"""The bundled sample corpus, how meta.json names its files, and the seeded split of a directory by file.

- `SAMPLE_DIR`: the sample corpus shipped with the package (sample/LICENSES.md); `portable(path)` names its
  files "sample:<relative path>", so meta.json is the same on every clone.
- `split_by_file(names, val_frac, seed)`: build-all's split of a directory source (roam, gutenberg), the rule
  `FILE_SPLIT_RULE` says in words.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from niels_gpt.seeds import TorchDraws

SAMPLE_DIR = Path(__file__).resolve().parent / "sample"
SAMPLE_PREFIX = "sample:"  # how describe() names bundled files, so meta.json is the same on every clone


def val_count(n: int, val_frac: float) -> int:
    """Files that go to val: round-half-up(val_frac * n), at least 1 when n >= 2, never all of them."""
    if n < 2 or val_frac == 0:
        return 0
    return min(n - 1, max(1, int(val_frac * n + 0.5)))


def split_by_file(names: Sequence[str], val_frac: float, seed: int) -> dict[str, list[int]]:
    """Indices into the sorted `names` for train and val, each in sorted-name order (FILE_SPLIT_RULE)."""
    n = len(names)
    perm = TorchDraws(seed).permutation(n)  # torch.randperm's, without torch (seeds.py)
    val = sorted(perm[: val_count(n, val_frac)])
    val_set = set(val)
    return {"train": [i for i in range(n) if i not in val_set], "val": val}


FILE_SPLIT_RULE = ("by file: perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)) over "
                   "the sorted relative file names; the first round-half-up(val_frac*n) entries of perm "
                   "(at least 1 when n >= 2, never all) are val; each split is read in sorted-name order")


def portable(path: str | os.PathLike) -> str:
    """A path for describe(): files of the bundled sample become "sample:<relative path>"."""
    try:
        return SAMPLE_PREFIX + Path(path).resolve().relative_to(SAMPLE_DIR).as_posix()
    except ValueError:
        return str(path)
