"""What a directory's commit marker (constants.MARKERS, written last) says it holds: the first half of
niels_gpt.locate and all the output guard needs, so the guard stays below the format readers.
Cost: one small JSON read; `outputs_below` globs three levels.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from niels_gpt.constants import EXAMPLES_NAME, MANIFEST_NAME, MARKERS, META_NAME, SPLITS
from niels_gpt.errors import FormatError


@dataclass
class Found:
    kind: str
    path: Path  # as given
    root: Path  # the output's own directory (where its record lives)
    split: str | None = None  # a split directory was given
    meta: dict = field(default_factory=dict)
    layout: str | None = None  # packed bins: memmap (manifest.json), parquet (Megatron-Bridge), npy (legacy pickle)
    info: Any = None  # foreign: the FormatInfo of niels_gpt.formats.detect (its files, dtype, splits)


def read_json(path: Path) -> dict | None:
    """A marker's JSON object (None for JSON that is not an object), or a FormatError naming the file."""
    try:
        doc = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise FormatError(f"{path}: not readable JSON ({exc}); rebuild the output, or restore the file") from None
    return doc if isinstance(doc, dict) else None


def by_marker(p: Path) -> Found | None:
    """What the marker in directory `p` (or in its parent, when `p` is a split directory) says: packed bins,
    a cache (`pretrain`, `sft`, `not-built`) or a tokenizer; None when no marker of these is there."""
    if (p / MANIFEST_NAME).is_file():
        return Found("packed", p, p, layout="memmap")
    for root, split in ((p, None), (p.parent, p.name)):
        if split is not None and split not in SPLITS:
            continue
        if (root / META_NAME).is_file():
            meta = read_json(root / META_NAME) or {}
            kind = meta.get("kind")
            if kind in ("pretrain", "sft"):
                return Found("not-built" if meta.get("built") is False else kind, p, root, split, meta)
            if kind == "tokenizer" and split is None:
                return Found("tokenizer", p, root, None, meta)
    return None


def outputs_below(p: Path) -> list[str]:
    """The outputs of ours one to three levels below directory `p` (a build-all root holds several), each
    named by its path relative to `p` with a trailing "/": any directory holding a commit marker."""
    found = {m.parent.relative_to(p).as_posix() + "/" for depth in ("*", "*/*", "*/*/*") for marker in MARKERS
             for m in p.glob(f"{depth}/{marker}")}
    return sorted(found)


def packed_files(d: Path) -> set[str] | None:
    """Every file packed bins at `d` consist of, relative to `d`, as their manifest lists them: the arrays,
    examples.npy, and the packed val split pack-sft writes in `val/`. None when the manifest is unreadable."""
    try:
        doc = read_json(d / MANIFEST_NAME) or {}
    except FormatError:
        return None
    files = doc.get("files")
    if not isinstance(files, dict):
        return None
    listed = {MANIFEST_NAME} | {str(f.get("name", k)) if isinstance(f, dict) else k for k, f in files.items()}
    rec = doc.get("examples")
    if isinstance(rec, dict) and rec.get("name") == EXAMPLES_NAME:
        listed.add(EXAMPLES_NAME)
    if d.name != "val" and (d / "val" / MANIFEST_NAME).is_file():
        listed |= {f"val/{name}" for name in packed_files(d / "val") or ()}
    return listed


def unfinished_tokens(d: Path) -> bool:
    """Whether directory `d` holds token files of ours but no commit marker (an unfinished build, or a marker
    removed): the one rule behind locate, verify and stats."""
    if not d.is_dir() or (d / META_NAME).is_file() or (d / MANIFEST_NAME).is_file():
        return False
    return (any(d.glob("*_tokens.bin")) or (d / "input_ids.npy").is_file()
            or any(any((d / split).glob("shard_*.bin*")) for split in SPLITS))


def unfinished_message(p: Path) -> str:
    """The one line for a directory `unfinished_tokens` finds (locate, verify and stats say it alike)."""
    return (f"{p}: token files but no {META_NAME} (or {MANIFEST_NAME}): unfinished build (its commit marker was "
            "never written, or was removed), so nothing here is read; build it again into a new directory, or "
            "remove this one and build again")


def present(p: Path) -> bool:
    """Whether `p` is there: a file, a directory, or a Megatron prefix (`p.bin` beside `p.idx`)."""
    return p.exists() or Path(str(p) + ".bin").exists()
