"""WikiText (raw variant) with whole articles rebuilt from its line rows.

The hub's wikitext has one row per line of the original files, so an article is spread over many
rows. Articles are rebuilt like this (the same for the hub parquet rows and for the raw .raw/.txt
files read with the "text" builder):

- an article starts at a top-level heading row ` = Title = ` (one "=" on each side; ` = = Sub = = `
  is a section heading inside the article) and runs to the row before the next one;
- light normalisation only: each line is stripped of surrounding whitespace (the raw files pad every
  line with one space), blank lines are dropped, lines are joined with "\n", and the tokeniser's
  number markers are undone: " @-@ " -> "-", " @,@ " -> ",", " @.@ " -> ".". Spaces around
  punctuation (`word , word`) stay as they are: that is the raw variant's text;
- rows before the first heading are counted as skipped ("before_first_heading"); a heading with no
  body is an empty document ("empty_document").

Splits are the dataset's own: iter_texts("train") reads `train`, iter_texts("val") reads `validation`.
Cost: one article in memory at a time (the longest wikitext-103 article is ~100 KB); rebuilding runs
at ~80 MB/s, reading through the `datasets` text builder at 5.6 MB/s (tools/measure_sources.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from niels_gpt.errors import ConfigError
from niels_gpt.sources.base import TextSource, check_field, rel_files
from niels_gpt.sources.hub import builder_for, iter_rows, open_stream
from niels_gpt.sources.text_io import as_paths

WIKITEXT_DATASET_ID = "Salesforce/wikitext"
WIKITEXT_CONFIG = "wikitext-103-raw-v1"
HUB_SPLITS = {"train": "train", "val": "validation"}
MARKERS = {" @-@ ": "-", " @,@ ": ",", " @.@ ": "."}


def is_article_heading(line: str) -> bool:
    """` = Title = ` but not ` = = Section = = `."""
    s = line.strip()
    return len(s) > 4 and s.startswith("= ") and s.endswith(" =") and not s.startswith("= =")


def normalise_line(line: str) -> str:
    for marker, plain in MARKERS.items():
        if marker in line:
            line = line.replace(marker, plain)
    return line.strip()


def rebuild_articles(lines: Iterable[str], skipped) -> Iterator[str]:
    """Whole articles from wikitext line rows (see the module docstring for the rules)."""
    current: list[str] | None = None
    for raw in lines:
        if is_article_heading(raw):
            if current is not None:
                yield from _emit(current, skipped)
            current = [normalise_line(raw)]
            continue
        line = normalise_line(raw)
        if not line:
            continue
        if current is None:
            skipped["before_first_heading"] += 1
            continue
        current.append(line)
    if current is not None:
        yield from _emit(current, skipped)


def _emit(lines: list[str], skipped) -> Iterator[str]:
    if len(lines) == 1:
        skipped["empty_document"] += 1
        return
    yield "\n".join(lines)


class WikiText(TextSource):
    name = "wikitext"
    own_split = True
    streaming = True
    split_rule = "the dataset's own splits: train -> train, val -> validation"

    def __init__(self, *, dataset_id: str, config: str | None, data_files: dict[str, Path] | None):
        super().__init__()
        self.dataset_id = dataset_id if data_files is None else None
        self.dataset_config = config if data_files is None else None
        self.data_files = data_files

    def files(self) -> list[str]:
        return rel_files(list((self.data_files or {}).values()))

    def _iter_split(self, split: str | None) -> Iterator[str]:
        for s in (["train", "val"] if split is None else [split]):
            yield from rebuild_articles(self._lines(s), self.skipped)

    def _lines(self, split: str) -> Iterator[str]:
        hub_split = HUB_SPLITS[split]
        if self.data_files is None:
            what = f"wikitext {self.dataset_id} (config {self.dataset_config}, split {hub_split})"
            ds = open_stream(self.dataset_id, what, name=self.dataset_config, split=hub_split)
            files: list[Path] = []
        else:
            path = self.data_files.get(hub_split)
            if path is None:
                # The caller gave files for some splits only: the missing one is empty, not an error.
                return
            what = f"wikitext {path}"
            ds = open_stream(builder_for(path, "wikitext"), what, data_files=[str(path)], split="train")
            files = [path]
        for i, row in iter_rows(ds, what, files):
            text = check_field(row, "text", f"{what}, record {i}")
            yield "" if text is None else text

    def _describe_extra(self) -> dict[str, Any]:
        return {"normalisation": "strip lines, drop blank lines, join with \\n, undo @-@ @,@ @.@"}


def wikitext(*, dataset_id: str = WIKITEXT_DATASET_ID, config: str | None = WIKITEXT_CONFIG,
             data_files: dict[str, str | os.PathLike] | str | os.PathLike | None = None) -> WikiText:
    """WikiText articles. data_files: {"train": path, "validation": path} (also "val"), each a raw
    .raw/.txt file (one line per row) or a .parquet/.jsonl file of the hub's rows; one path alone is the
    train split (as `datasets.load_dataset(data_files=path)` reads it), with an empty validation split."""
    files = None
    if isinstance(data_files, (str, os.PathLike)):
        data_files = {"train": data_files}
    if data_files is not None and not isinstance(data_files, dict):
        raise ConfigError(f"wikitext: data_files is a {type(data_files).__name__}; pass one path (the train split) "
                          "or {'train': path, 'validation': path}")
    if data_files is not None:
        files = {}
        for key, p in data_files.items():
            split = HUB_SPLITS.get(key, key)
            if split not in HUB_SPLITS.values():
                raise ConfigError(f"wikitext: data_files key {key!r} is not a split; use 'train' and "
                                  "'validation'")
            (path,) = as_paths(p, f"wikitext {key}")
            builder_for(path, "wikitext")
            files[split] = path
    return WikiText(dataset_id=dataset_id, config=config, data_files=files)
