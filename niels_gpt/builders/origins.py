"""Origins in a cache: where each document (pretraining) or example (SFT) came from.

Two files beside the token files, listed in meta.json's `files` (so `verify` checks their sha256) and described
by meta.json's `origins` ({"file": "origins.npy", "inputs": "origins.json"}):

| file           | contents                                                                             |
|----------------|--------------------------------------------------------------------------------------|
| `origins.npy`  | one row per document of the cache: the train split's documents in order, then val's;  |
|                | a structured array of the fields input, record, char_start, char_end                  |
|                | (sources/origins.py says what each is) that vary over the cache, each the narrowest   |
|                | little-endian int (unsigned where none is negative) that holds their values           |
| `origins.json` | `splits`: {"train": n, "val": m}, the documents of each split (the first n rows are   |
|                | train's); `constant`: {field: value} for each field left out of the array that holds  |
|                | one value for every document (a field in neither is -1: none has one, e.g. a chat     |
|                | example's char range); `inputs`: index -> {path or URL as meta.json's `source.files`  |
|                | names it, sha256 (a dataset: its id, config, split; a URL: the store's version),      |
|                | kind, and `record` where it differs from `records`[kind]}; `records`: kind -> what an  |
|                | origin's `record` counts in an input of that kind                                     |

Cost: a .npy header and the inputs table, then only the fields that vary per document (docs/trace.md).
Every executor writes the same bytes (a parallel build's tasks write `<id>.origins.npy` parts, mapped here
to the plan's inputs). A document cut by a budget keeps its whole origin. A dataset shard's record is
`shard << 40 | row`.
"""

from __future__ import annotations

from pathlib import Path

from niels_gpt.sources.base import portable
from niels_gpt.sources.digests import digest
from niels_gpt.sources.lines import file_sha256
from niels_gpt.sources.origins import _counts
from niels_gpt.sources.records import Piece, _opens_a_document

SHARD_SHIFT = 40


def input_table(inputs: list[str], kinds: list[str], config: str | None = None, split: str = "train") -> list[dict]:
    """One entry per input of the plan: its name (as meta.json's source.files), what identifies its bytes, and
    what an origin's `record` counts in it."""
    out = []
    for name, kind in zip(inputs, kinds or [""] * len(inputs), strict=True):
        if kind == "dataset":
            ident = f"dataset:{name}:{config}:{split}"
        elif "://" in name:
            ident = digest(Piece(item=name, kind=kind))
        else:
            ident = file_sha256(name)
        record = _counts(kind)
        if kind == ".json" and "://" not in name and _opens_a_document(Path(name)):
            record = "element of the array, from 1"
        out.append({"path": portable(name), "sha256": ident, "kind": kind, "record": record})
    return out


class InputIndex:
    """Task piece -> the plan's input index (and a dataset shard's number in the record)."""

    def __init__(self, inputs: list[str], offset: int = 0):
        self.index = {name: offset + i for i, name in enumerate(inputs)}

    def row(self, pieces: list[dict], origin) -> tuple[int, int, int, int]:
        k, record, a, b = (int(x) for x in origin)
        piece = pieces[k]
        if piece.get("kind") == "dataset" and piece.get("stop", -1) >= 0:
            record |= int(piece["start"]) << SHARD_SHIFT
        return self.index[piece["item"]], record, a, b


