"""What a command may delete or replace: only what this library made. One guard for every writer.

Every command that writes (`build`, `dist-build`, `build-all`, `train-tokenizer`, `convert`, `pack-sft`,
`train`, `download`) asks `check_output` before any work starts. An output path may be written when it is

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

A symlink to a directory is followed: the output is written where it points, so the link keeps
pointing at it. Each refusal is one line naming the path, what is there and the fix. Work and staging
directories are removed only by the command that created them (niels_gpt/staging.py, the dist-build
driver). Cost: one directory walk of an existing output (its file names only), nothing for a new one.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterable
from pathlib import Path

from niels_gpt.atomic import TMP_SUFFIX
from niels_gpt.constants import MANIFEST_NAME, META_NAME
from niels_gpt.errors import ConfigError

RECEIPT_NAME = "niels_receipt.json"  # convert's commit marker for the peers' formats (formats/receipt.py)
PLAN_NAME = "plan.json"  # a dist-build work directory's marker (builders/dist.py)
LOCK_SUFFIX = ".lock"

# kind -> what its marker is and says. A cache is a pretraining or SFT cache (meta.json "kind").
KINDS = {
    "cache": "a token cache (meta.json of kind pretrain or sft)",
    "tokenizer": "a tokenizer directory (meta.json of kind tokenizer)",
    "packed": "packed SFT bins (manifest.json)",
    "converted": "a converted corpus (niels_receipt.json)",
    "work": "a dist-build work directory (plan.json and parts/)",
}
WALK_LIMIT = 100_000  # entries looked at in a directory without a marker before it is called a root


class OutputRefused(ConfigError):
    """An output path this command may not write: not ours, another kind, or overlapping an input."""


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def what_is_there(path: Path) -> tuple[str | None, set[str] | None]:
    """(kind, the relative paths its marker lists) of an output of ours at `path`; (None, None) when no
    marker of ours is there; (kind, None) when a marker is there but cannot be read."""
    meta_file, manifest, receipt, plan = (path / n for n in (META_NAME, MANIFEST_NAME, RECEIPT_NAME, PLAN_NAME))
    if meta_file.is_file():
        meta = _read_json(meta_file)
        if meta is None:
            return "unreadable", None
        kind = meta.get("kind")
        files = meta.get("files")
        if kind in ("pretrain", "sft"):
            return "cache", _plus(set(files) if isinstance(files, dict) else None, META_NAME)
        if kind == "tokenizer":
            model = meta.get("model_file") or "spm.model"
            return "tokenizer", {META_NAME, str(model), "spm.vocab", "tokenizer_config.json", "special_tokens_map.json"}
        return "unreadable", None
    if manifest.is_file():
        doc = _read_json(manifest)
        files = (doc or {}).get("files")
        if not isinstance(files, dict):
            return "packed", None
        listed = {MANIFEST_NAME} | {str(f.get("name", k)) if isinstance(f, dict) else k for k, f in files.items()}
        return "packed", listed | _packed_val_files(path) | _examples(doc)
    if receipt.is_file():
        doc = _read_json(receipt)
        files = (doc or {}).get("files")
        return "converted", _plus(set(files) if isinstance(files, dict) else None, RECEIPT_NAME)
    if plan.is_file():
        return "work", None  # its parts are named by task ids: everything under it is the driver's
    return None, None


def _packed_val_files(path: Path) -> set[str]:
    """The files of the packed val split pack-sft writes beside the train bins (`val/`), as its manifest lists them."""
    doc = _read_json(path / "val" / MANIFEST_NAME) if (path / "val" / MANIFEST_NAME).is_file() else None
    files = (doc or {}).get("files")
    if not isinstance(files, dict):
        return set()
    return ({f"val/{MANIFEST_NAME}"} | {f"val/{f.get('name', k) if isinstance(f, dict) else k}" for k, f in files.items()}
            | {f"val/{n}" for n in _examples(doc)})


def _examples(manifest: dict) -> set[str]:
    """pack-sft's examples.npy (each packed sequence's cache example) where a manifest lists it."""
    rec = (manifest or {}).get("examples")
    return {"examples.npy"} if isinstance(rec, dict) and rec.get("name") == "examples.npy" else set()


def _plus(listed: set[str] | None, name: str) -> set[str] | None:
    return None if listed is None else listed | {name}


def _ours_below(path: Path) -> list[str]:
    """Outputs of ours under `path` (a build-all root holds several), named relative to it; few levels."""
    found = []
    for depth_glob in ("*", "*/*", "*/*/*"):
        for marker in (META_NAME, MANIFEST_NAME, RECEIPT_NAME):
            for m in path.glob(f"{depth_glob}/{marker}"):
                found.append(m.parent.relative_to(path).as_posix() + "/")
    return sorted(set(found))


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
        if "://" in text:
            continue
        p = Path(text)
        if not p.exists() and not p.is_symlink():
            continue
        real = _resolved_quiet(p)
        rel = _overlap(out, real)
        if rel == "is":
            raise OutputRefused(f"{flag} {out}: is the {what} {text} itself; writing there would replace it: "
                                f"choose an output outside the {what}s")
        if rel == "inside":
            raise OutputRefused(f"{flag} {out}: inside the {what} directory {text}; the output would mix with it "
                                f"(and be read as {what} next time): choose an output outside the {what}s")
        if rel == "above":
            raise OutputRefused(f"{flag} {out}: holds the {what} {text}; replacing it would delete the {what}: "
                                f"choose an output outside the {what}s")


def _resolved_quiet(p: Path) -> Path:
    try:
        return p.resolve()
    except (RuntimeError, OSError):
        return p.absolute()


def check_output(out: str | os.PathLike, *, kind: str, flag: str = "--out", inputs: Iterable = (),
                 others: Iterable[tuple[str, str | os.PathLike]] = (), replace: bool = True) -> Path:
    """Refuse, before any work, an output path this command may not write (see the module's table).

    `kind`: the kind of output the command writes (a key of KINDS); only an existing output of that kind
    is replaced. `inputs`: local paths the command reads. `others`: (flag, path) of the command's other
    outputs, which must not overlap this one. `replace=False`: an existing output of ours is refused too
    (for commands that only ever write new outputs). Returns the real path to write (symlinks followed).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown output kind {kind!r}")
    given = Path(out)
    real = _resolved(given, flag)
    cwd = Path.cwd().resolve()
    if real == cwd or real in cwd.parents:
        here = "the current directory" if real == cwd else "a directory above the current one"
        raise OutputRefused(f"{flag} {out}: is {here}; a command replaces its output whole, so it never writes "
                            "there: choose a new directory, e.g. {flag} out/NAME".replace("{flag}", flag))
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
        below = _ours_below(real)
        if below:
            shown = ", ".join(below[:4]) + (", ..." if len(below) > 4 else "")
            raise OutputRefused(f"{flag} {out}: a root holding several outputs ({shown}), not one output; a "
                                f"command replaces only an output it made: give {flag} {Path(out) / 'NAME'} "
                                "(a new directory) instead")
        shown = ", ".join(sorted(entries)[:3]) + (", ..." if len(entries) > 3 else "")
        raise OutputRefused(f"{flag} {out}: a non-empty directory that is not an output of this library (it "
                            f"holds {shown}); nothing in it is deleted or replaced: {fix}")
    if found == "unreadable":
        raise OutputRefused(f"{flag} {out}: its {META_NAME} is not a readable record of this library, so "
                            f"what the directory holds is unknown and it is not replaced: {fix}")
    if not replace:
        raise OutputRefused(f"{flag} {out}: already holds {KINDS[found]}; this command writes only new "
                            f"outputs: choose a new {flag} directory (or remove that one yourself)")
    if found != kind:
        raise OutputRefused(f"{flag} {out}: holds {KINDS[found]}, not {KINDS[kind]}; it is not replaced by "
                            f"another kind of output: choose another {flag}")
    if listed is not None:
        stray = _unlisted(real, listed)
        if stray:
            shown = ", ".join(stray[:3]) + (", ..." if len(stray) > 3 else "")
            raise OutputRefused(f"{flag} {out}: holds {KINDS[found]} and also {shown}, which its record does "
                                f"not list and this library did not write; replacing the output would delete "
                                f"it: {fix}")
    return real
