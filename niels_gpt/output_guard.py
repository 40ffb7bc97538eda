"""What a command may delete or replace: only what this library made. One guard for every writer.

Every command that writes asks `check_output` before any work starts. An output path may be written when it is

| what is there                                             | verdict                                          |
|-----------------------------------------------------------|--------------------------------------------------|
| nothing, or an empty directory                            | written                                          |
| an output of the same kind with its commit marker, every  | replaced whole (built aside, swapped in: staging) |
| file in it listed by that marker (temporaries of killed   |                                                  |
| runs of ours aside)                                       |                                                  |
| an output of another kind (a tokenizer where a cache goes)| refused                                          |
| a marker that does not list a file that is there          | refused, naming the file                         |
| a non-empty directory without a marker                    | refused; "a root of several outputs" when outputs |
|                                                           | of ours lie below it (a build-all root)          |
| a regular file, a dangling or looping symlink             | refused                                          |
| the current directory or one above it (`.`, `..`)         | refused                                          |
| equal to, inside or above one of the command's inputs,    | refused                                          |
| or overlapping another output of the same command         |                                                  |

A symlink to a directory is followed (the link keeps pointing at the output). Each refusal is one line
naming the path, what is there and the fix. Cost: one walk of an existing output's file names.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from pathlib import Path

from niels_gpt.atomic import TMP_SUFFIX
from niels_gpt.constants import MARKERS, META_NAME, MODEL_NAME, RECEIPT_NAME
from niels_gpt.errors import ConfigError, FormatError, first_few
from niels_gpt.markers import by_marker, outputs_below, packed_files, read_json
from niels_gpt.urls import is_url

PLAN_NAME = "plan.json"  # a parallel build's work directory's marker (builders/tasks.py)

# kind -> what its marker is and says. A cache is a pretraining or SFT cache (meta.json "kind").
KINDS = {
    "cache": "a token cache (meta.json of kind pretrain or sft)",
    "tokenizer": "a tokenizer directory (meta.json of kind tokenizer)",
    "packed": "packed SFT bins (manifest.json)",
    "converted": "a converted corpus (niels_receipt.json)",
    "work": "a build's work directory (plan.json and parts/)",
}


class OutputRefused(ConfigError):
    """An output path this command may not write: not ours, another kind, or overlapping an input."""


def what_is_there(path: Path) -> tuple[str | None, set[str] | None]:
    """(kind, the relative paths its marker lists) of an output of ours at `path`: a key of KINDS, None (not
    ours), "unreadable" (a marker that cannot be read) or "split" (a split directory of a cache)."""
    if (path / PLAN_NAME).is_file():
        return "work", None  # its parts are named by task ids: everything under it is the driver's
    try:
        found = by_marker(path)
        receipt = read_json(path / RECEIPT_NAME) if (path / RECEIPT_NAME).is_file() else None
    except FormatError:
        return "unreadable", None
    if found is not None and found.split is not None:
        return "split", None
    if found is not None and found.kind == "packed":
        return "packed", packed_files(path)
    if found is not None and found.kind == "tokenizer":
        model = found.meta.get("model_file") or MODEL_NAME
        return "tokenizer", {META_NAME, str(model), "spm.vocab", "tokenizer_config.json", "special_tokens_map.json"}
    if found is not None:  # a cache, built or build-all's placeholder
        files = found.meta.get("files")
        return "cache", {META_NAME, *files} if isinstance(files, dict) else None
    if (path / META_NAME).is_file():
        return "unreadable", None  # a meta.json of no kind of ours
    if (path / RECEIPT_NAME).is_file():
        files = (receipt or {}).get("files")
        return "converted", {RECEIPT_NAME, *files} if isinstance(files, dict) else None
    return None, None


def _unlisted(path: Path, listed: set[str]) -> list[str]:
    """Files under `path` its marker does not list (directories and our own temporaries aside)."""
    out = []
    for root, dirs, files in os.walk(path):
        rel_root = Path(root).relative_to(path)
        dirs[:] = [d for d in dirs if not TMP_SUFFIX.search(d)]
        for name in files:
            rel = (rel_root / name).as_posix()
            if rel not in listed and not TMP_SUFFIX.search(name):
                out.append(rel)
    return sorted(out)


def _resolved(path: Path, flag: str) -> Path:
    """`path` made absolute with symlinks followed; a dangling or looping link is refused."""
    try:
        if path.is_symlink():
            target = path.resolve(strict=True)
            if not target.is_dir():
                raise OutputRefused(f"{flag} {path}: a symlink to {target}, which is not a directory; "
                                    "point it at a directory, or choose another path")
            return target
        return path.resolve()
    except (RuntimeError, OSError) as exc:  # a loop (ELOOP / RuntimeError on older Pythons) or a dangling link
        looping = isinstance(exc, RuntimeError) or getattr(exc, "errno", None) == errno.ELOOP
        why = "a symlink that loops back on itself" if looping else "a symlink to nothing (its target is missing)"
        raise OutputRefused(f"{flag} {path}: {why}; remove the link or choose another path") from None


def _overlap(a: Path, b: Path) -> str | None:
    if a == b:
        return "is"
    if b in a.parents:
        return "inside"
    if a in b.parents:
        return "above"
    return None


def check_overlap(out: Path, inputs: Iterable, flag: str, *, what: str = "input") -> None:
    """Refuse an output equal to, inside or above any of `inputs` (local paths; URLs and ids skipped)."""
    for item in inputs:
        text = os.fspath(item)
        if is_url(text):
            continue
        p = Path(text)
        if not p.exists() and not p.is_symlink():
            continue
        rel = _overlap(out, _resolved_quiet(p))
        why = {"is": f"is the {what} {text} itself; writing there would replace it",
               "inside": f"inside the {what} directory {text}; the output would mix with it (and be read as "
                         f"{what} next time)",
               "above": f"holds the {what} {text}; replacing it would delete the {what}"}.get(rel)
        if why is not None:
            raise OutputRefused(f"{flag} {out}: {why}: choose an output outside the {what}s")


def _resolved_quiet(p: Path) -> Path:
    try:
        return p.resolve()
    except (RuntimeError, OSError):
        return p.absolute()


def check_output(out: str | os.PathLike, *, kind: str, flag: str = "--out", inputs: Iterable = (),
                 others: Iterable[tuple[str, str | os.PathLike]] = ()) -> Path:
    """The real path to write (symlinks followed), or a refusal before any work (the module's table).

    `kind`: a key of KINDS, the only kind replaced. `inputs`: local paths the command reads. `others`: (flag,
    path) of the command's other outputs, which must not overlap this one.
    """
    assert kind in KINDS, kind
    given = Path(out)
    real = _resolved(given, flag)
    cwd = Path.cwd().resolve()
    if real == cwd or real in cwd.parents:
        here = "the current directory" if real == cwd else "a directory above the current one"
        raise OutputRefused(f"{flag} {out}: is {here}; a command replaces its output whole, so it never writes "
                            f"there: choose a new directory, e.g. {flag} out/NAME")
    check_overlap(real, inputs, flag)
    for other_flag, other in others:
        other_real = _resolved_quiet(Path(other))
        rel = _overlap(real, other_real)
        if rel is not None:
            where = {"is": "is the same path as", "inside": "is inside", "above": "holds"}[rel]
            raise OutputRefused(f"{flag} {out} {where} {other_flag} {other}; the two outputs of one command "
                                "must not overlap: choose separate directories")
    if not real.exists():
        return real
    if not real.is_dir():
        raise OutputRefused(f"{flag} {out}: a file, not a directory; a command never replaces a file it did "
                            "not write: choose another path")
    try:
        entries = [e for e in os.listdir(real) if not TMP_SUFFIX.search(e)]
    except OSError as exc:
        raise OutputRefused(f"{flag} {out}: cannot list this directory ({exc.strerror}); fix its permissions "
                            "or choose another path") from None
    if not entries:
        return real
    found, listed = what_is_there(real)
    fix = f"move what you want to keep out of it, or choose a new {flag} directory"
    if found is None:
        below = outputs_below(real)
        if below:
            raise OutputRefused(f"{flag} {out}: a root holding several outputs ({first_few(below, 4)}), not "
                                "one output; a command replaces only an output it made: give "
                                f"{flag} {Path(out) / 'NAME'} (a new directory) instead")
        raise OutputRefused(f"{flag} {out}: a non-empty directory that is not an output of this library (it "
                            f"holds {first_few(sorted(entries))}); nothing in it is deleted or replaced: "
                            f"{fix}")
    if found == "unreadable":
        marker = next((m for m in MARKERS if (real / m).is_file()), META_NAME)
        raise OutputRefused(f"{flag} {out}: its {marker} is not a readable record of this library, so "
                            f"what the directory holds is unknown and it is not replaced: {fix}")
    if found == "split":
        raise OutputRefused(f"{flag} {out}: the {real.name} split of the cache {Path(out).parent} (its "
                            f"{META_NAME} lists these files), not an output of its own; a command replaces a "
                            f"whole output only: give {flag} {Path(out).parent} to replace the cache, or a new "
                            "directory")
    if found != kind:
        raise OutputRefused(f"{flag} {out}: holds {KINDS[found]}, not {KINDS[kind]}; it is not replaced by "
                            f"another kind of output: choose another {flag}")
    if listed is not None:
        stray = _unlisted(real, listed)
        if stray:
            raise OutputRefused(f"{flag} {out}: holds {KINDS[found]} and also {first_few(stray)}, which its "
                                f"record does not list and this library did not write; replacing the output "
                                f"would delete it: {fix}")
    return real
