"""A user's own corpus as a source: any mix of local files, directories, globs, URLs and dataset ids.

    src = corpus(["data/", "extra/*.jsonl.zst", "notes.md", "s3://bucket/more/*.parquet"], text_field="text")
    src.iter_texts()                      # documents, in the order of the sources as given
    chats = corpus(["sft.jsonl"], chat=True).iter_conversations()
    books = corpus(["books/"], layout="gutenberg")        # a layout by name; build-all's sources are these

It reads through the same layers as `build`, so it yields exactly the documents a build of it holds, one
piece at a time; skipped records are counted by reason in `skipped` and reported by `describe()`.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Iterator, Sequence
from typing import Any

from niels_gpt.errors import ConfigError
from niels_gpt.sources.documents import Rules, Skipped
from niels_gpt.sources.stream import Plan, plan_reading, stream_items

ON_BAD_RECORD = ("error", "skip")


class Corpus:
    """Documents (or conversations) from a mix of local files, URLs and dataset ids."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.skipped: collections.Counter[str] = collections.Counter()  # by reason, over every read of it

    def files(self) -> list[str]:
        return [i for i, lay in zip(self.plan.inputs, self.plan.layouts, strict=True) if lay != "dataset"]

    def input_bytes(self) -> int | None:
        return self.plan.input_bytes()

    def _items(self) -> Iterator[Any]:
        for item in stream_items(self.plan):
            if isinstance(item, Skipped):
                self.skipped[item.reason] += 1
            else:
                yield item

    def iter_texts(self, split: str | None = None) -> Iterator[str]:
        """The documents, in the order of the sources as given (the builder splits them: split must be None)."""
        if split is not None:
            raise ConfigError(f"corpus: split={split!r}, but a corpus has no train/val split of its own (the cache "
                              "builder splits it); call iter_texts() with split=None")
        if self.plan.chat:
            raise ConfigError("this corpus was opened with chat=True: read it with iter_conversations()")
        yield from self._items()

    def iter_conversations(self) -> Iterator[list[dict]]:
        if not self.plan.chat:
            raise ConfigError("this corpus holds documents: open it with corpus(..., chat=True) for conversations")
        yield from self._items()

    def describe(self) -> dict[str, Any]:
        """JSON-able facts for meta.json: what was read, how, and what was skipped by reason."""
        return {**self.plan.describe(), "skipped": dict(sorted(self.skipped.items())), "own_split": False}

    def __repr__(self) -> str:
        return f"<Corpus files={len(self.files())}>"


def corpus(sources: Sequence[str | os.PathLike], *, text_field: str = "text",
           messages_field: str = "messages", chat_columns: Sequence[str] | None = None,
           on_bad_record: str = "error", hf_config: str | None = None, split: str = "train", chat: bool = False,
           layout: str | None = None) -> Corpus:
    """A corpus over `sources` (files, directories, globs, URLs, dataset ids); see the module docstring."""
    if on_bad_record not in ON_BAD_RECORD:
        raise ConfigError(f"on_bad_record must be one of {ON_BAD_RECORD}, got {on_bad_record!r}")
    if chat_columns is not None and len(chat_columns) != 2:
        raise ConfigError(f"chat_columns must name two columns (user, assistant), got {list(chat_columns)}")
    rules = Rules(text_field, messages_field, tuple(chat_columns) if chat_columns else None, on_bad_record)
    return Corpus(plan_reading(sources, rules=rules, chat=chat or chat_columns is not None, layout=layout,
                               config=hf_config, split=split))
