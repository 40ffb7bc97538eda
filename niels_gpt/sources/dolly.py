"""databricks-dolly-15k as two-turn conversations.

Each record `{"instruction", "context", "response", "category"}` becomes

    [{"role": "user", "content": <instruction>  or  <instruction>"\n\nContext:\n"<context>},
     {"role": "assistant", "content": <response>}]

The context block is added only when the context is non-empty after stripping (about 30% of the
records: closed QA, summarisation, information extraction); the layout is `CONTEXT_TEMPLATE` and
can be changed with `context_template=`. Instruction, context and response are stripped of
surrounding whitespace, nothing else. A record with an empty response has no assistant turn and is
skipped ("no_assistant_turn"); one with an empty instruction is skipped ("empty_user_turn").
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from niels_gpt.errors import ConfigError, SourceError
from niels_gpt.sources.base import ChatSource, assistant, rel_files, user
from niels_gpt.sources.hub import builder_for_all, iter_rows, open_stream
from niels_gpt.sources.text_io import as_paths
from niels_gpt.tokenizer.base import Message

DOLLY_DATASET_ID = "databricks/databricks-dolly-15k"
DOLLY_SPLIT = "train"
CONTEXT_TEMPLATE = "{instruction}\n\nContext:\n{context}"
DOLLY_FIELDS = ("instruction", "context", "response")


class Dolly15k(ChatSource):
    name = "dolly15k"
    streaming = True

    def __init__(self, *, dataset_id: str, data_files: list[Path] | None, context_template: str):
        super().__init__()
        self.dataset_id = dataset_id if data_files is None else None
        self.data_files = data_files
        self.context_template = context_template

    def files(self) -> list[str]:
        return rel_files(self.data_files or [])

    def iter_conversations(self) -> Iterator[list[Message]]:
        if self.data_files is None:
            what = f"dolly15k {self.dataset_id}"
            ds = open_stream(self.dataset_id, what, split=DOLLY_SPLIT)
        else:
            what = f"dolly15k local files {self.files()}"
            ds = open_stream(builder_for_all(self.data_files, "dolly15k"), what,
                             data_files=[str(p) for p in self.data_files], split="train")
        for i, row in iter_rows(ds, what, self.data_files or ()):
            conv = self.conversation(row, f"{what}, record {i}")
            if conv is not None:
                yield conv

    def conversation(self, row: dict, record: str) -> list[Message] | None:
        values = {}
        for field in DOLLY_FIELDS:
            v = row.get(field)
            if field not in row or not (v is None or isinstance(v, str)):
                raise SourceError(f"{record}: field {field!r} is missing or not text (fields: "
                                  f"{sorted(row)}); dolly records need {DOLLY_FIELDS}")
            values[field] = (v or "").strip()
        if not values["response"]:
            self.skipped["no_assistant_turn"] += 1
            return None
        if not values["instruction"]:
            self.skipped["empty_user_turn"] += 1
            return None
        prompt = (self.context_template.format(**values) if values["context"]
                  else values["instruction"])
        return [user(prompt), assistant(values["response"])]

    def _describe_extra(self) -> dict[str, Any]:
        return {"user_turn": f"instruction, or {self.context_template!r} when context is non-empty",
                "assistant_turn": "response"}


def dolly15k(*, dataset_id: str = DOLLY_DATASET_ID,
             data_files: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
             context_template: str = CONTEXT_TEMPLATE) -> Dolly15k:
    """dolly-15k conversations (user: instruction [+ context], assistant: response)."""
    for key in ("{instruction}", "{context}"):
        if key not in context_template:
            raise ConfigError(f"dolly15k: context_template {context_template!r} lacks {key}")
    files = None if data_files is None else as_paths(data_files, "dolly15k data_files")
    if files is not None:
        builder_for_all(files, "dolly15k")
    return Dolly15k(dataset_id=dataset_id, data_files=files, context_template=context_template)
