"""What every source shares: the two base classes, file reading, the seeded file split, `datasets` rows.

- `TextSource.iter_texts(split)` yields `str` documents; `ChatSource.iter_conversations()` yields
  `list[Message]`. Both are lazy: a source holds paths and settings, never the corpus.
- Skipped records are counted by reason in `source.skipped` (a Counter) while iterating; the count
  accumulates over every iteration of that source object, and `describe()` reports it.
- Local files are decoded strictly as UTF-8: a bad byte is a `SourceError` naming the file, the byte
  offset and the line, never a silent replacement character.
- Hub-backed sources read through `datasets.load_dataset(..., streaming=True)`; local files of the
  same schema take the same call with a packaged builder ("parquet", "json", "text").
"""

from __future__ import annotations

import collections
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from niels_gpt.constants import SPLITS
from niels_gpt.errors import ConfigError, SourceError
from niels_gpt.tokenizer.base import Message

SAMPLE_DIR = Path(__file__).resolve().parent / "sample"
SAMPLE_PREFIX = "sample:"  # how describe() names bundled files, so meta.json is the same on every clone
VAL_FRAC = 0.1



class _Source:
    """What every source shares: skipped-record counts, the files it reads, and describe()."""

    name: str = "source"
    dataset_id: str | None = None
    dataset_config: str | None = None
    streaming: bool = False
    split_rule: str = ""

    def __init__(self) -> None:
        self.skipped: collections.Counter[str] = collections.Counter()

    def files(self) -> list[str]:
        return []

    def input_paths(self) -> list[Path]:
        """The local files this source reads (empty for a hub stream): what a progress bar sizes."""
        return [Path(f) for f in self.files()]

    def describe(self) -> dict[str, Any]:
        """JSON-able facts for meta.json: what was read, how it was split, what was skipped."""
        return {
            "name": self.name,
            "dataset_id": self.dataset_id,
            "dataset_config": self.dataset_config,
            "files": [portable(f) for f in self.files()],
            "streaming": self.streaming,
            "split_rule": self.split_rule,
            "skipped": dict(sorted(self.skipped.items())),
            **self._describe_extra(),
        }

    def _describe_extra(self) -> dict[str, Any]:
        return {}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} files={len(self.files())}>"


class TextSource(_Source):
    """A lazy iterator of pretraining documents. Subclasses implement `_iter_split`."""

    name: str = "text"
    own_split: bool = False

    def iter_texts(self, split: str | None = None) -> Iterator[str]:
        """Documents in order. split=None: every document (own-split sources: train, then val);
        "train"/"val": that split, only for sources with a split of their own."""
        if split is None:
            yield from self._iter_split(None)
            return
        if split not in SPLITS:
            raise ConfigError(f"{self.name}: unknown split {split!r}; use one of {SPLITS} or None")
        if not self.own_split:
            raise ConfigError(f"{self.name} has no train/val split of its own (the cache builder "
                              "splits it); call iter_texts() with split=None")
        yield from self._iter_split(split)

    def _iter_split(self, split: str | None) -> Iterator[str]:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "own_split": self.own_split}


class ChatSource(_Source):
    """A lazy iterator of SFT conversations (`list[Message]`, each with an assistant turn)."""

    name: str = "chat"
    split_rule = "none: the SFT cache builder splits by example (seeded val_frac)"

    def iter_conversations(self) -> Iterator[list[Message]]:
        raise NotImplementedError


# ---------------------------------------------------------------------------------------------
# Seeded split by file list


def val_count(n: int, val_frac: float) -> int:
    """Files that go to val: round-half-up(val_frac * n), at least 1 when n >= 2, never all of them."""
    if n < 2 or val_frac == 0:
        return 0
    return min(n - 1, max(1, int(val_frac * n + 0.5)))


def check_val_frac(val_frac: float, what: str) -> None:
    if not 0 <= val_frac < 1:
        raise ConfigError(f"{what}: val_frac={val_frac} is outside [0, 1); use e.g. 0.1")


def split_by_file(names: Sequence[str], val_frac: float, seed: int) -> dict[str, list[int]]:
    """Indices into the sorted `names` for train and val.

    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)); the first
    val_count(n, val_frac) entries of perm are val. Both lists come back in sorted-name order,
    so a document's split depends only on (sorted names, val_frac, seed).
    """
    import torch

    n = len(names)
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n, generator=g).tolist()
    val = sorted(perm[: val_count(n, val_frac)])
    val_set = set(val)
    return {"train": [i for i in range(n) if i not in val_set], "val": val}


FILE_SPLIT_RULE = ("by file: perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)) over "
                   "the sorted relative file names; the first round-half-up(val_frac*n) entries of perm "
                   "(at least 1 when n >= 2, never all) are val; each split is read in sorted-name order")


def rel_files(paths: Sequence[Path]) -> list[str]:
    return [str(p) for p in paths]


def portable(path: str | os.PathLike) -> str:
    """A path for describe(): files of the bundled sample become "sample:<relative path>"."""
    try:
        return SAMPLE_PREFIX + Path(path).resolve().relative_to(SAMPLE_DIR).as_posix()
    except ValueError:
        return str(path)


def check_field(row: dict, field: str, record: str) -> Any:
    if field not in row:
        raise SourceError(f"{record}: no {field!r} field (fields: {sorted(row)}); pass the right "
                          "field name (text_field=...) or fix the file")
    return row[field]


def user(content: str) -> Message:
    return {"role": "user", "content": content}


def assistant(content: str) -> Message:
    return {"role": "assistant", "content": content}
