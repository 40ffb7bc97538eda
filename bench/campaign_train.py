"""Reliability campaign for `train`: kill it at seeded random moments, resume it, and corrupt its checkpoints.

    python bench/campaign_train.py                          # 20 kills, 300 byte flips (~5 min on 2 cores)
    python bench/campaign_train.py --kills 2 --flips 24 --json out.json

Kills. A tiny model trains on a small pretraining cache (60 steps, `--save-every 7`) as a subprocess in its own
process group. Each kill picks a seeded step (0: during set-up, before the loop; the last: its final save, bpb and
exit), reads the run's log up to the step before it, waits a seeded share of that step's time, and sends SIGKILL
(even kills) or SIGINT (odd kills: the graceful path, which must exit 130 having saved the step it was in). So a
kill lands where it is aimed whatever the machine's load. Then:
  - complete-looking partial checkpoints: a `ckpt_*.pt` under its final name that does not load and verify
    (target 0; a save is written to a temporary and renamed, so a kill leaves at most a temporary);
  - the run is rerun with `--resume latest` (or from scratch when no checkpoint was saved yet), in this process;
  - it must reach the straight run's state: the same loss at every step it logs, and a final checkpoint whose
    model and optimizer tensors equal the straight run's bit for bit (target 0 differences);
  - leftovers: temporaries of killed saves still in the run directory after the rerun (target 0);
  - the run directory's lock (`<out-dir>.lock`): a SIGKILL leaves it behind; the rerun must take it over, not
    be refused by it (target 0), and release it when it ends (target 0 left).
Corruption. On the straight run's last checkpoint: single-bit flips at random offsets, truncations and an
extension. Per change: refused on load (a package error naming the file), harmless (it loads, and the payload is
the clean one: a flip in zip padding or an unread header field), or silently different (target 0), or a crash
(any other exception; target 0). A few refused ones are also given to `train --resume` on the command line,
which must print one error line and write nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch

from niels_gpt.errors import NielsGPTError

PY = sys.executable
STEPS, SAVE_EVERY = 60, 7
MODEL = ["--depth", "1", "--n-embd", "32", "--seq-len", "32", "--device-batch-size", "4", "--eval-steps", "1",
         "--log-every", "1"]
LOSS = re.compile(r"^step (\d+)/\d+ \| loss (\S+) \|", re.M)


def train_args(cache: Path, out: Path, *extra: str, steps: int = STEPS, save_every: int = SAVE_EVERY) -> list[str]:
    return ["train", str(cache), "--out-dir", str(out), *MODEL, "--steps", str(steps), "--save-every",
            str(save_every), *extra]


def cli(args: list[str]) -> tuple[int, str, str]:
    """Run the CLI in this process: (status, stdout, stderr)."""
    import contextlib
    import io

    from niels_gpt.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(args)
    return status, out.getvalue(), err.getvalue()


def losses(log: str) -> dict[int, str]:
    return {int(step): value for step, value in LOSS.findall(log)}


def tensors(path: Path) -> list[torch.Tensor]:
    from niels_gpt.train.checkpoint import load_checkpoint

    ckpt = load_checkpoint(path)
    out = list(ckpt["model"].values())
    for opt in ckpt["optimizers"]:
        for state in opt["state"].values():
            out += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return out


def same_tensors(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b, strict=True))


def partial_checkpoints(out: Path) -> int:
    """Checkpoints under their final name that do not load and verify."""
    from niels_gpt.train.checkpoint import load_checkpoint

    bad = 0
    for ckpt in sorted(out.glob("ckpt_*.pt")):
        try:
            load_checkpoint(ckpt)
        except NielsGPTError:
            bad += 1
    return bad


def launch(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([PY, "-m", "niels_gpt.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})  # a killed run's log ends at a line


def read_until(p: subprocess.Popen, step: int) -> tuple[list[str], float]:
    """Read the run's log up to the line of `step` (0: the set-up line before the loop); (the lines read,
    that step's duration in seconds, 0 for the set-up line)."""
    lines = []
    for line in p.stdout:
        lines.append(line)
        if step == 0 and line.startswith("data: "):
            return lines, 0.0
        m = LOSS.match(line)
        if m and int(m.group(1)) >= step:
            dt = re.search(r"\| dt (\d+) ms", line)
            return lines, (float(dt.group(1)) / 1e3 if dt else 0.0)
    return lines, 0.0


def run_kills(work: Path, cache: Path, kills: int, rng: random.Random, steps: int, save_every: int,
              first: int = 0, last: int | None = None) -> tuple[list[dict], dict]:
    def args(out: Path, *extra: str) -> list[str]:
        return train_args(cache, out, *extra, steps=steps, save_every=save_every)

    straight_dir = work / "straight"
    status, log, err = cli(args(straight_dir))  # the reference run, in this process
    if status:
        raise RuntimeError(f"the straight run failed: {err}")
    want_losses = losses(log)
    want = tensors(straight_dir / f"ckpt_{steps:06d}.pt")
    rows, totals = [], Counter()
    for k in range(kills):
        sig = signal.SIGINT if k % 2 else signal.SIGKILL
        out = work / f"kill-{k}"
        row = Counter({"kills": 1})
        p = launch(args(out))
        # a seeded moment: inside step `at` (0: just before the loop; `steps`: its last save, bpb and exit),
        # a seeded share of one step's time after the previous step's line
        at = rng.randint(first, steps if last is None else last)
        head, dt = read_until(p, max(at - 1, 0))
        time.sleep(rng.uniform(0.0, 1.0) * dt)
        lock = out.with_name(out.name + ".lock")
        running = p.poll() is None
        held = lock.exists()  # the run may be past its loop (a loaded machine reads its log late): lock gone
        if running:
            os.killpg(p.pid, sig) if sig == signal.SIGKILL else p.send_signal(sig)
        log, err = p.communicate()
        log = "".join(head) + log
        row[f"{signal.Signals(sig).name} while running"] += running
        if running and sig == signal.SIGINT:
            row["SIGINT: exit 130 with one line"] += p.returncode == 130 and len(err.strip().splitlines()) == 1
            row["SIGINT: the step saved"] += bool(re.search(r"saved \S+ckpt_\d+\.pt", err))
        row["complete-looking partial"] += partial_checkpoints(out)
        resumed = any(out.glob("ckpt_*.pt"))
        row[f"{signal.Signals(sig).name} with the lock held"] += running and held
        row["lock left by the kill"] += lock.exists()  # a SIGKILL's: its holder is dead, so the rerun takes it
        status, log2, err2 = cli(args(out, *(["--resume", "latest"] if resumed else [])))
        row["reruns"] += 1
        row["rerun failed"] += status != 0
        row["rerun refused by a stale lock"] += "another run is writing it" in err2
        row["lock left after the rerun"] += lock.exists()
        got = {**losses(log), **losses(log2)}
        row["losses differ from the straight run"] += any(want_losses.get(s) != v for s, v in got.items())
        final = out / f"ckpt_{steps:06d}.pt"
        row["final state differs from the straight run"] += not (final.is_file() and same_tensors(tensors(final),
                                                                                                 want))
        row["leftovers after rerun"] += len([q for q in out.iterdir() if ".tmp-" in q.name]) if out.exists() else 0
        rows.append({"kill": k, "signal": signal.Signals(sig).name, "in step": at, "resumed": resumed, **row})
        totals.update(row)
    return rows, dict(totals)


def changes(size: int, flips: int, rng: random.Random):
    for _ in range(flips):
        off, bit = rng.randrange(size), rng.randrange(8)
        yield f"flip @{off}", lambda d, o=off, b=bit: d[:o] + bytes([d[o] ^ (1 << b)]) + d[o + 1:]
    for cut in sorted({0, 1, 22, size // 4, size // 2, size - 4096, size - 22, size - 1}):
        if 0 <= cut < size:
            yield f"truncate to {cut}", lambda d, c=cut: d[:c]
    yield "extend by 1 KiB", lambda d: d + b"\0" * 1024


def run_corruption(work: Path, cache: Path, flips: int, rng: random.Random) -> dict:
    from niels_gpt.train.checkpoint import latest_checkpoint, load_checkpoint

    clean_path = latest_checkpoint(work / "straight")
    clean = clean_path.read_bytes()
    reference = tensors(clean_path)
    probe = work / "corrupt" / clean_path.name
    probe.parent.mkdir()
    row, tried = Counter(), set()
    for what, mutate in changes(len(clean), flips, rng):
        probe.write_bytes(mutate(clean))
        row["changes"] += 1
        try:
            load_checkpoint(probe)
        except NielsGPTError:
            row["refused on load"] += 1
            kind = what.split()[0]
            if kind in ("flip", "truncate") and kind not in tried:  # one of each through the command line
                tried.add(kind)
                _cli_refuses(work, cache, probe, row)
            continue
        except Exception:  # noqa: BLE001 - a crash is what the campaign exists to count
            row["crashed (not a package error)"] += 1
            continue
        if same_tensors(tensors(probe), reference):
            row["harmless (the clean payload)"] += 1
        else:
            row["silently different"] += 1
    return dict(row)


def _cli_refuses(work: Path, cache: Path, probe: Path, row: Counter) -> None:
    out = work / "resume-corrupt"
    before = sorted(p.name for p in probe.parent.iterdir())
    status, _, err = cli(train_args(cache, out, "--resume", str(probe), steps=STEPS + 3))
    lines = [line for line in err.splitlines() if line.strip()]
    ok = status == 1 and len(lines) == 1 and lines[0].startswith("error: ") and str(probe) in lines[0]
    row["train --resume refused it in one line"] += ok
    row["train --resume wrote something"] += (out.exists() and any(out.iterdir())) or \
        sorted(p.name for p in probe.parent.iterdir()) != before


def build_cache(work: Path, tok: str | None = None) -> Path:
    """A small pretraining cache of the bundled sample corpus (a 1,000-piece tokenizer trained first)."""
    from niels_gpt.sources import SAMPLE_DIR

    if tok is None:
        status, _, err = cli(["train-tokenizer", "--sample", "--cache-dir", str(work / "t"), "--vocab-size", "1000",
                              "--tokenizer-max-chars", "300000", "--no-progress"])
        if status:
            raise RuntimeError(err)
        tok = str(work / "t" / "tokenizer" / "spm.model")
    cache = work / "cache"
    status, _, err = cli(["build", str(SAMPLE_DIR / "fineweb_edu"), "--out", str(cache), "--tokenizer", tok,
                          "--val-tokens", "2048", "--no-progress"])
    if status:
        raise RuntimeError(err)
    return cache


def run_train_campaign(work: Path, *, kills: int, flips: int, seed: int = 0, tok: str | None = None,
                       cache: Path | None = None, steps: int = STEPS, save_every: int = SAVE_EVERY,
                       first: int = 0, last: int | None = None) -> dict:
    """The campaign's figures (module docstring); bench/campaign.py calls this with its tokenizer, the test
    with a cache of its own and fewer steps. `first`..`last`: the steps a kill may land in (default: all)."""
    rng = random.Random(seed)
    work.mkdir(parents=True, exist_ok=True)
    cache = cache or build_cache(work, tok)
    kill_rows, kill_totals = run_kills(work, cache, kills, rng, steps, save_every, first, last)
    return {"kills": kill_rows, "kill_totals": kill_totals, "corruption": run_corruption(work, cache, flips, rng)}


def report(result: dict) -> None:
    print("train kills:")
    for r in result["kills"]:
        print("  " + ", ".join(f"{k}: {v}" for k, v in r.items()))
    print("train kill totals: " + ", ".join(f"{k}: {v}" for k, v in sorted(result["kill_totals"].items())))
    print("train checkpoint corruption: " + ", ".join(f"{k}: {v}" for k, v in sorted(result["corruption"].items())))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kills", type=int, default=20, help="kills of a training run (default: 20)")
    ap.add_argument("--flips", type=int, default=300, help="bit flips in a checkpoint (default: 300)")
    ap.add_argument("--seed", type=int, default=0, help="seed of every random choice (default: 0)")
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="campaign-train-"))
    try:
        result = run_train_campaign(work, kills=args.kills, flips=args.flips, seed=args.seed)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
