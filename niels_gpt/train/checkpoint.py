"""Checkpoints (`ckpt_<step>.pt`, a sha256 of the payload checked on load) and the run directory they go in.

An --out-dir this run may write: a new or empty directory, this run's own directory (--resume; from a
checkpoint before the newest only with --overwrite, the later ones going), or another run's with --overwrite
(--overwrite's files go when this run saves its first checkpoint). Refused: a directory with files this
trainer did not write, one overlapping the data or the --init-from checkpoint, and one another train holds
(`run_lock`: `<out-dir>.lock`, the lock `build` takes, niels_gpt/staging.py). run.json records the run and
its checkpoints; `--keep-last N` prunes the older ones it records, never the newest nor one a run beside it
started from (--init-from).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from pathlib import Path

import torch

from niels_gpt.atomic import TMP_SUFFIX, atomic_path, remove_stale_temporaries, write_bytes_atomic
from niels_gpt.errors import OutputLockedError, StateError, first_few
from niels_gpt.output_guard import OutputRefused, check_overlap
from niels_gpt.staging import lock_path, output_lock

CHECKPOINT_VERSION = 2  # 2: a sha256 of the payload; 1 (no digest) still loads, unverified
CKPT_PATTERN = re.compile(r"ckpt_(\d{6,})\.pt$")  # step 1,000,000 on: seven digits and more
RUN_NAME = "run.json"
RUN_KIND = "niels_gpt train run"


def checkpoint_name(step: int) -> str:
    return f"ckpt_{step:06d}.pt"


def checkpoints(out_dir: str | os.PathLike) -> list[Path]:
    """This run's checkpoints in `out_dir`, by step (ckpt_999999.pt before ckpt_1000000.pt)."""
    found = [p for p in Path(out_dir).glob("ckpt_*.pt") if CKPT_PATTERN.match(p.name)]
    return sorted(found, key=lambda p: int(CKPT_PATTERN.match(p.name).group(1)))


def latest_checkpoint(out_dir: str | os.PathLike) -> Path | None:
    return (checkpoints(out_dir) or [None])[-1]


def payload_digest(obj) -> str:
    """sha256 over a checkpoint payload: dict keys in sorted order, tensors as dtype, shape and bytes."""
    h = hashlib.sha256()

    def walk(x):
        if isinstance(x, dict):
            h.update(b"{")
            for k in sorted(x, key=str):
                h.update(repr(k).encode())
                walk(x[k])
            h.update(b"}")
        elif isinstance(x, (list, tuple)):
            h.update(b"[")
            for v in x:
                walk(v)
            h.update(b"]")
        elif isinstance(x, torch.Tensor):
            t = x.detach().cpu().reshape(-1).contiguous()
            h.update(f"T{t.dtype}{tuple(x.shape)}".encode())
            h.update(t.view(torch.uint8).numpy().tobytes())
        else:
            h.update(repr(x).encode())

    walk(obj)
    return h.hexdigest()


def save_checkpoint(path: Path, payload: dict) -> str:
    """Write `payload` with its digest atomically, then run.json beside it; returns the digest."""
    path.parent.mkdir(parents=True, exist_ok=True)
    digest = payload_digest(payload)
    with atomic_path(path) as tmp:
        torch.save({**payload, "version": CHECKPOINT_VERSION, "sha256": digest}, tmp)
    cfg, before = payload["train_config"], read_run(path.parent) or {}
    listed = {name: v for name, v in before.get("checkpoints", {}).items() if (path.parent / name).is_file()}
    saved = {**listed, path.name: {"step": payload["step"], "sha256": digest}}
    # absolute (a run pruning from another directory finds it); a resume names none: its run still started there
    source = str(Path(cfg["init_from"]).resolve()) if cfg.get("init_from") else before.get("init_from")
    write_run(path.parent, {"data": cfg["data"], "model": payload["model_config"], "seed": cfg["seed"],
                            "steps": cfg["steps"], "init_from": source,
                            "checkpoints": saved,
                            "order_changes": payload.get("order_changes", [])})
    return digest


def checkpoint_file(path: str | os.PathLike, flag: str = "--resume") -> Path:
    """`path` when it is a file; StateError naming what is there otherwise."""
    p = Path(path)
    if not p.is_file():
        what = "a directory" if p.is_dir() else "no such file"
        raise StateError(f"{flag} {p}: {what}; give a checkpoint file (ckpt_<step>.pt){_others(p, flag)}")
    return p


def load_checkpoint(path: str | os.PathLike, *, flag: str = "--resume") -> dict:
    """A checkpoint's payload, its digest checked; StateError naming the file and what to do otherwise."""
    p = checkpoint_file(path, flag)
    try:
        ckpt = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a damaged zip or pickle raises many kinds; each is this one condition
        why = " ".join(str(exc).split())
        why = f"{type(exc).__name__}: {why[:160]}{'...' if len(why) > 160 else ''}"
        raise StateError(f"{flag} {p}: not a readable checkpoint ({why}); it is damaged or "
                         f"not a checkpoint of this trainer: pick another{_others(p, flag)}") from None
    if not isinstance(ckpt, dict) or ckpt.get("version") not in (1, CHECKPOINT_VERSION) or "model" not in ckpt:
        raise StateError(f"{flag} {p}: not a checkpoint of version {CHECKPOINT_VERSION} written by this trainer: "
                         f"pick another{_others(p, flag)}")
    recorded = ckpt.pop("sha256", None)
    version = ckpt.pop("version")
    if recorded is None and version != 1:
        raise StateError(f"{flag} {p}: its checksum is missing, so it cannot be trusted: pick another{_others(p, flag)}")
    if recorded is not None and payload_digest(ckpt) != recorded:
        raise StateError(f"{flag} {p}: checksum mismatch: the file changed after it was written (a disk or copy "
                         f"error); it is not used: pick another{_others(p, flag)}")
    ckpt["verified"] = recorded is not None
    return ckpt


# where no other checkpoint is there: the way on without one, by the flag that named the file
WITHOUT = {"--resume": ", or start without --resume", "--init-from": ", or start from fresh weights (without --init-from)",
           "sample": ""}


def _others(p: Path, flag: str = "--resume") -> str:
    """` (this run's others: ...), e.g. FLAG PATH` where the directory holds others; the way on otherwise."""
    found = [c for c in checkpoints(p.parent) if c != p] if p.parent.is_dir() else []
    if not found:
        return WITHOUT.get(flag, "")
    return f" (this run's others: {', '.join(c.name for c in found[-3:])}), e.g. {flag} {found[-1]}"


# -- the run directory -----------------------------------------------------------------------------

def is_ours(name: str) -> bool:
    """A file name this trainer writes into a run directory (a temporary of one included)."""
    base = TMP_SUFFIX.sub("", name)
    return bool(CKPT_PATTERN.match(base)) or base == RUN_NAME


def describe_run(out: Path) -> str:
    """One phrase naming the run a directory holds: what run.json says, else its checkpoints' names."""
    ckpts = [p.name for p in checkpoints(out)]
    # the last four: "..." before them when earlier ones are left out
    steps = ("..., " if len(ckpts) > 4 else "") + ", ".join(str(int(CKPT_PATTERN.match(n).group(1))) for n in ckpts[-4:])
    record = read_run(out)
    if record is None:
        return f"checkpoints at steps {steps}" if ckpts else "no checkpoint yet"
    model = record.get("model", {})
    return (f"a run on {record.get('data')} ({model.get('n_layer')} layers x {model.get('n_embd')}, seed "
            f"{record.get('seed')}, {record.get('steps')} steps), checkpoints at steps {steps or 'none'}")


def read_run(out: Path) -> dict | None:
    try:
        record = json.loads((out / RUN_NAME).read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("kind") == RUN_KIND else None


def write_run(out: Path, record: dict) -> None:
    write_bytes_atomic(out / RUN_NAME, (json.dumps({"kind": RUN_KIND, **record}, indent=1, sort_keys=True,
                                                   default=str) + "\n").encode())


def check_out_dir(out_dir: str | os.PathLike, *, data: list, init_from: str | None, resume: Path | None,
                  overwrite: bool) -> list[Path]:
    """Refuse an --out-dir this run may not write; returns the files --overwrite removes: an earlier run's, or
    the checkpoints after the one a run resumes from."""
    out = Path(out_dir)
    real = out.resolve()
    check_overlap(real, data, "--out-dir", what="data")
    if init_from:
        check_overlap(real, [init_from], "--out-dir", what="--init-from checkpoint")
    if not out.exists():
        return []
    if not out.is_dir():
        raise OutputRefused(f"--out-dir {out}: a file, not a directory; checkpoints go into a directory: choose "
                            "another --out-dir")
    entries = sorted(os.listdir(out))
    foreign = [e for e in entries if not is_ours(e) or (out / e).is_dir()]
    if foreign:
        raise OutputRefused(f"--out-dir {out}: holds files this trainer did not write "
                            f"({first_few(foreign)}); nothing in it is replaced: choose a new or empty --out-dir")
    remove_stale_temporaries(out)  # only our files are there: what a killed save left, its writer dead
    ours = [out / e for e in entries if not TMP_SUFFIX.search(e)]
    if not ours:
        return []
    if resume is not None and resume.resolve().parent == real:  # the run continues where it is
        at = CKPT_PATTERN.match(resume.name)
        later = [p for p in checkpoints(out) if at and int(CKPT_PATTERN.match(p.name).group(1)) > int(at.group(1))]
        if later and not overwrite:
            raise OutputRefused(f"--resume {resume}: {out} holds the run's later checkpoints "
                                f"({first_few([p.name for p in later])}); resumed from an earlier one, the run would "
                                "write a second history beside them, and --resume latest and trace would mix the two: "
                                "pass --overwrite to remove them when this run saves its first checkpoint, or resume "
                                "into a new --out-dir to keep them")
        if theirs := [p.name for p in later if p.name not in (read_run(out) or {}).get("checkpoints", {})]:
            raise OutputRefused(f"--resume {resume} --overwrite: {out} holds later checkpoints its {RUN_NAME} does not "
                                f"record as the run's ({first_few(theirs)}): they are not this run's to remove; move "
                                "them out of the run directory")
        return later
    if overwrite:
        return ours
    how = (f"--resume {resume} is another run's checkpoint: resuming it here would mix two runs; " if resume
           else "")
    raise OutputRefused(f"--out-dir {out}: holds {describe_run(out)}; {how}continue that run with --resume latest, "
                        "replace it with --overwrite (its files are deleted when this run saves its first "
                        "checkpoint), or choose a new --out-dir")


@contextlib.contextmanager
def run_lock(out_dir: str | os.PathLike):
    """Hold `<out-dir>.lock` while the block runs; OutputLockedError naming the holder otherwise."""
    out = Path(out_dir)
    made = [d for d in out.absolute().parents if not d.exists()]  # the lock's parents it creates
    with contextlib.ExitStack() as held:
        held.callback(_remove_if_empty, made)
        try:
            lock = held.enter_context(output_lock(out))
        except OutputLockedError:
            lock = lock_path(out)
            try:
                holder = json.loads(lock.read_text("utf-8"))
            except (OSError, ValueError):
                holder = {}
            holder = holder if isinstance(holder, dict) else {}
            raise OutputLockedError(
                f"--out-dir {out}: another run is writing it (pid {holder.get('pid')} on {holder.get('host')} "
                f"since {holder.get('since')} holds {lock}); wait for it to end or choose another --out-dir (if "
                "that process is gone, e.g. on another host, remove the lock file and rerun)") from None
        yield lock


def _remove_if_empty(made: list[Path]) -> None:
    """Remove the directories the lock created (deepest first) where nothing was written into them."""
    for d in made:
        with contextlib.suppress(OSError):
            d.rmdir()


def prune_checkpoints(out_dir: str | os.PathLike, keep: int, saved: Path | None = None) -> list[Path]:
    """Remove the checkpoints run.json records but the newest `keep` (the module docstring) and the one just
    `saved` (a run resumed from an earlier checkpoint saves below the newest step); returns them."""
    out = Path(out_dir)
    record = read_run(out)
    if record is None or keep < 1:
        return []
    listed = record.get("checkpoints", {})
    ours = [p for p in checkpoints(out) if p.name in listed]
    kept = {latest_checkpoint(out).resolve(), *_started_from(out), *([Path(saved).resolve()] if saved else [])}
    gone = [p for p in ours[:-keep] if p.resolve() not in kept]
    remove_files(gone)
    kept = {name: v for name, v in listed.items() if (out / name).is_file()}
    write_run(out, {**{k: v for k, v in record.items() if k != "kind"}, "checkpoints": kept})
    return gone


def _started_from(out: Path) -> set[Path]:
    """The checkpoints runs beside `out` started from (their run.json's init_from)."""
    found = set()
    for record in out.parent.glob(f"*/{RUN_NAME}"):
        source = (read_run(record.parent) or {}).get("init_from")
        if isinstance(source, str) and source:
            found.add(Path(source).resolve())
    return found


def remove_files(files: list[Path]) -> None:
    """Delete `files` where they still are: an earlier run's (those check_out_dir listed), or pruned checkpoints."""
    for f in files:
        f.unlink(missing_ok=True)
