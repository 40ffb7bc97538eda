"""fineweb-edu (streamed from the hub, or local files of its schema).

fineweb_edu is the contract's call, verbatim:
    load_dataset("HuggingFaceFW/fineweb-edu", name="CC-MAIN-2024-10", split="train", streaming=True)
        .shuffle(seed=42, buffer_size=10_000)
yielding each row's `text`. With `data_files=` (local Parquet or JSONL of the same schema) the same
code runs on `load_dataset("parquet"|"json", data_files=...)`: that is how it is tested offline.
Nothing is materialised: the stream holds one shuffle buffer (10,000 rows, ~50 MB of fineweb text).
The order is the stream's order after the seeded buffer shuffle; it is as stable as the upstream
stream ("best effort" determinism, recorded as streaming=true in meta.json).

Cost (tools/measure_sources.py, 2 cores): 57 MB/s from local JSONL, 45 MB/s with the 10k buffer
shuffle. datasets 5.x sleeps 5 s at the end of a buffer-shuffled Parquet stream (its workaround
for apache/arrow#45214): a fixed cost per pass.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from niels_gpt.constants import SEED
from niels_gpt.errors import ConfigError, SourceError
from niels_gpt.sources.base import TextSource, check_field, rel_files
from niels_gpt.sources.hub import builder_for_all, iter_rows, open_stream
from niels_gpt.sources.text_io import as_paths

FINEWEB_DATASET_ID = "HuggingFaceFW/fineweb-edu"
FINEWEB_CONFIG = "CC-MAIN-2024-10"
FINEWEB_SPLIT = "train"
FINEWEB_STREAMING = True
SHUFFLE_BUFFER = 10_000
TEXT_FIELD = "text"


def is_empty(text: Any) -> bool:
    return text is None or (isinstance(text, str) and not text.strip())


class FineWebEdu(TextSource):
    name = "fineweb_edu"
    own_split = False

    def __init__(self, *, dataset_id: str, config: str | None, split: str, streaming: bool,
                 seed: int | None, buffer_size: int, data_files: list[Path] | None, text_field: str):
        super().__init__()
        self.dataset_id = dataset_id if data_files is None else None
        self.dataset_config = config if data_files is None else None
        self.split = split
        self.streaming = streaming
        self.seed = seed
        self.buffer_size = buffer_size
        self.data_files = data_files
        self.text_field = text_field
        self.split_rule = ("none: one stream, "
                           + (f"shuffle(seed={seed}, buffer_size={buffer_size})" if seed is not None
                              else "not shuffled")
                           + "; the pretrain cache builder splits it by token budget")

    def files(self) -> list[str]:
        return rel_files(self.data_files or [])

    def _open(self):
        if self.data_files is None:
            what = f"fineweb_edu {self.dataset_id} (config {self.dataset_config})"
            ds = open_stream(self.dataset_id, what, streaming=self.streaming, name=self.dataset_config,
                             split=self.split)
        else:
            what = f"fineweb_edu local files {self.files()}"
            builder = builder_for_all(self.data_files, "fineweb_edu")
            ds = open_stream(builder, what, streaming=self.streaming,
                             data_files=[str(p) for p in self.data_files], split="train")
        if self.seed is not None:
            # NOTE: an in-memory (non-streaming) Dataset shuffles exactly and takes no buffer size.
            ds = (ds.shuffle(seed=self.seed, buffer_size=self.buffer_size) if self.streaming
                  else ds.shuffle(seed=self.seed))
        return ds, what

    def _iter_split(self, split: str | None) -> Iterator[str]:
        ds, what = self._open()
        for i, row in iter_rows(ds, what, self.data_files or ()):
            text = check_field(row, self.text_field, f"{what}, record {i}")
            if text is not None and not isinstance(text, str):
                raise SourceError(f"{what}, record {i}: the {self.text_field!r} field holds {type(text).__name__} "
                                  f"({text!r:.60}), not text; each record must be an object whose "
                                  f"{self.text_field!r} is a string (or pass text_field= / --text-field)")
            if is_empty(text):
                self.skipped["empty_document"] += 1
                continue
            yield text

    def _describe_extra(self) -> dict[str, Any]:
        return {"split": self.split, "seed": self.seed, "buffer_size": self.buffer_size,
                "text_field": self.text_field}


def fineweb_edu(*, dataset_id: str = FINEWEB_DATASET_ID, config: str | None = FINEWEB_CONFIG,
                split: str = FINEWEB_SPLIT, streaming: bool = FINEWEB_STREAMING, seed: int | None = SEED,
                buffer_size: int = SHUFFLE_BUFFER,
                data_files: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
                text_field: str = TEXT_FIELD) -> FineWebEdu:
    """fineweb-edu documents, streamed and buffer-shuffled; `seed=None` keeps the stream order.

    data_files: local .parquet or .jsonl files of the fineweb-edu schema (dataset_id/config are then
    unused). Rows whose text is empty or missing are skipped and counted as "empty_document".
    """
    if buffer_size < 1:
        raise ConfigError(f"fineweb_edu: buffer_size={buffer_size} must be >= 1 (use seed=None for no "
                          "shuffle)")
    files = None if data_files is None else as_paths(data_files, "fineweb_edu data_files")
    if files is not None:
        builder_for_all(files, "fineweb_edu")
    return FineWebEdu(dataset_id=dataset_id, config=config, split=split, streaming=streaming, seed=seed,
                      buffer_size=buffer_size, data_files=files, text_field=text_field)
