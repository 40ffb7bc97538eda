"""Reliability campaign: kill builders at random moments, corrupt finished outputs, race builds and readers.

    python bench/campaign.py                    # the full run: 20 kills per job, >= 200 byte flips (~15 min)
    python bench/campaign.py --kills 2 --flips 24 --json out.json   # what tests/test_campaign.py runs

Kills. Each job (build-all pretrain and SFT; `build` inline, on local processes and on Ray (where installed),
and `build --chat`; `train-tokenizer SRC...`, whole, sampled (`--max-chars`, `--doc-chars`,
`--read-as`) and with `--trainer rustbpe`; pack-sft; convert to every format, compressed too; the
writers fresh and over an existing output written with other settings) runs as a subprocess in its own process group
and is SIGKILLed. Kills alternate between two moments: while it writes (a seeded random share of its clean run's
writing time, the time it held its output's lock, after that lock appears: a start-up takes most of a small job's time, and a kill there tests
nothing) and a seeded random share of its whole clean run time (anywhere, start-up included). Then:
  - complete-looking partial outputs: a commit marker (meta.json / manifest.json / niels_receipt.json) over
    files that are neither the old output nor the clean new one (target 0);
  - refused: with no marker, `verify` and the output's reader must fail with a package error;
  - the job is rerun as it was, with nothing removed by hand: it must succeed, and its output must be
    byte-identical to the clean build (target 0 differences);
  - temporaries, staging directories and locks left beside or inside the outputs after the rerun (target 0).
Corruption. On finished outputs of every kind (the tokenizer directory too): single-byte flips (one at a time, restored after), one-byte
truncations and extensions of every file, and one digit changed in each number of each JSON/YAML file. Per
change: caught by `verify`; caught when the reader opens; silently different items from the reader (a change
the reader does not catch and that changes what it serves). Payload bytes are `verify`'s to catch; every size,
count and header field must be caught on open or change nothing. The figures are also given per file kind
(records by name, data files by suffix): how many single changes `verify` caught of how many made.
Races. Two build-all runs into one --cache-dir at once; a reader opening a cache again and again while it is
rebuilt (every open either serves a complete cache or fails with a package error).
Training. `train` killed and resumed, its checkpoints corrupted: bench/campaign_train.py (without --only, or
with `--only train`).
"""

from __future__ import annotations

import argparse
import importlib.util
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

import numpy as np
import torch

from niels_gpt.errors import NielsGPTError

PY = sys.executable
CLI = [PY, "-m", "niels_gpt.cache.cli"]
FORMATS = ["niels", "nanogpt", "nanogpt-legacy", "kempner-npy", "raw", "megatron"]
MARKERS = ("meta.json", "manifest.json", "niels_receipt.json")


def sh(args: list[str], cwd: Path, *, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(args, cwd=cwd, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {r.stderr[-2000:]}")
    return r


def snapshot(path: Path) -> dict[str, bytes] | None:
    if not path.exists():
        return None
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def lock_of(out: Path) -> Path:
    return out.with_name(out.name + ".lock")  # every writer holds it while it writes (niels_gpt/staging.py)


def run_watched(args: list[str], cwd: Path, out: Path) -> tuple[float, float | None]:
    """Run a job to its end: (seconds it took, seconds its output's lock was held; None if never seen)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(args, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    taken = released = None
    while p.poll() is None:
        held = lock_of(out).exists()
        if taken is None and held:
            taken = time.perf_counter()
        if taken is not None and released is None and not held:
            released = time.perf_counter()
        time.sleep(0.001)
    err = p.communicate()[1]
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {err[-2000:]}")
    end = time.perf_counter()
    return end - t0, None if taken is None else (released or end) - taken


def leftovers(root: Path) -> list[str]:
    pat = re.compile(r"\.(tmp|old)-\d+$|\.lock$")
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if pat.search(p.name))


# --- the jobs -------------------------------------------------------------------------------------------

class Job:
    """A command writing one output, how to prepare an existing output, and how to read it."""

    def __init__(self, name: str, args: list[str], output: str, kind: str, before: list[str] | None = None):
        self.name, self.args, self.output, self.kind, self.before = name, args, output, kind, before


def jobs(tok: str) -> list[Job]:
    common = ["--sample", "--tokenizer", tok, "--no-progress", "--replace-tokenizer"]
    out = [
        Job("pretrain fresh", ["build-all", "--cache-dir", "c", "--only", "wikitext", *common],
            "c/pretrain/wikitext", "pretrain"),
        Job("pretrain over", ["build-all", "--cache-dir", "c", "--only", "wikitext", *common],
            "c/pretrain/wikitext", "pretrain",
            before=["build-all", "--cache-dir", "c", "--only", "wikitext", *common, "--shard-bytes", "64KB"]),
        Job("sft fresh", ["build-all", "--cache-dir", "c", "--only", "oasst1", *common], "c/sft/oasst1", "sft"),
        Job("sft over", ["build-all", "--cache-dir", "c", "--only", "oasst1", *common], "c/sft/oasst1", "sft",
            before=["build-all", "--cache-dir", "c", "--only", "oasst1", *common, "--val-frac", "0.5"]),
        Job("pack-sft fresh", ["pack-sft", "REF/c/sft/oasst1", "packed", "--seq-len", "1024"], "packed", "packed"),
        Job("pack-sft over", ["pack-sft", "REF/c/sft/oasst1", "packed", "--seq-len", "1024"], "packed", "packed",
            before=["pack-sft", "REF/c/sft/oasst1", "packed", "--seq-len", "1024", "--algorithm", "bfd"]),
    ]
    from niels_gpt.sources import SAMPLE_DIR

    corpus = [str(SAMPLE_DIR / "fineweb_edu"), str(SAMPLE_DIR / "gutenberg")]
    base = ["build", *corpus, "--out", "b", "--tokenizer", tok, "--val-tokens", "4096", "--no-progress",
            "--task-bytes", "65536"]
    chats = ["build", str(SAMPLE_DIR / "oasst1" / "oasst1-trees.jsonl"), str(SAMPLE_DIR / "dolly15k"), "--chat",
             "--out", "s", "--tokenizer", tok, "--val-frac", "0.2", "--no-progress", "--executor", "processes",
             "--workers", "2", "--task-bytes", "16384"]
    tok_sources = ["train-tokenizer", str(SAMPLE_DIR / "roam"), str(SAMPLE_DIR / "gutenberg"), "--out", "tk",
                   "--no-progress"]
    train_tok = [*tok_sources, "--vocab-size", "800", "--tokenizer-max-chars", "400000"]
    # a seeded sample of documents cut to --doc-chars, wikitext's *.raw files read as text
    sampled = ["train-tokenizer", str(SAMPLE_DIR / "wikitext"), str(SAMPLE_DIR / "gutenberg"), str(SAMPLE_DIR / "roam"),
               "--out", "tk-sampled", "--no-progress", "--read-as", ".raw=text"]
    train_sampled = [*sampled, "--vocab-size", "800", "--max-chars", "400000", "--doc-chars", "3000"]
    rust_sources = ["train-tokenizer", str(SAMPLE_DIR / "roam"), str(SAMPLE_DIR / "gutenberg"), "--out", "tk-rustbpe",
                    "--no-progress", "--trainer", "rustbpe"]
    train_rust = [*rust_sources, "--vocab-size", "800"]
    for executor, extra in (("inline", ["--workers", "2"]), ("processes", ["--workers", "2"]),
                            ("ray", ["--workers", "2", "--ray-address", "local"])):
        if executor == "ray" and importlib.util.find_spec("ray") is None:
            continue
        build = [*base, "--executor", executor, *extra]
        out += [Job(f"build {executor} fresh", build, "b", "pretrain"),
                Job(f"build {executor} over", build, "b", "pretrain", before=[*build, "--shard-bytes", "64KB"])]
    out += [
        Job("build chat fresh", chats, "s", "sft"),
        Job("build chat over", chats, "s", "sft", before=[*chats, "--val-frac", "0.5"]),
        Job("train-tokenizer fresh", train_tok, "tk", "tokenizer"),
        Job("train-tokenizer over", train_tok, "tk", "tokenizer",
            before=[*tok_sources, "--vocab-size", "700", "--tokenizer-max-chars", "300000"]),
        Job("train-tokenizer sampled fresh", train_sampled, "tk-sampled", "tokenizer"),
        Job("train-tokenizer sampled over", train_sampled, "tk-sampled", "tokenizer",
            before=[*sampled, "--vocab-size", "700", "--max-chars", "300000", "--doc-chars", "1000"]),
        Job("train-tokenizer rustbpe fresh", train_rust, "tk-rustbpe", "tokenizer"),
        Job("train-tokenizer rustbpe over", train_rust, "tk-rustbpe", "tokenizer",
            before=[*rust_sources, "--vocab-size", "700"]),
    ]
    for fmt in FORMATS:
        extra = ["--not-for-kempnerforge"] if fmt == "raw" else []
        out.append(Job(f"convert {fmt}", ["convert", "REF/c/pretrain/wikitext", f"conv-{fmt}", "--to", fmt, *extra],
                       f"conv-{fmt}", "converted"))
    zstd = ["convert", "REF/c/pretrain/wikitext", "conv-zstd", "--to", "niels", "--compress", "zstd"]
    out += [Job("convert niels zstd", zstd, "conv-zstd", "pretrain"),
            Job("convert nanogpt over", ["convert", "REF/c/pretrain/wikitext", "conv-over", "--to", "nanogpt"],
                "conv-over", "converted",
                before=["convert", "REF/c/pretrain/wikitext", "conv-over", "--to", "nanogpt", "--bos-index"])]
    return out


def read_items(kind: str, path: Path) -> list[np.ndarray]:
    """What the output's reader serves: a fixed, seeded set of items (raises a package error if refused)."""
    if kind == "pretrain":
        from niels_gpt.cache.pretrain_dataset import PretrainTokenStreamDataset

        out = []
        for split in ("train", "val"):
            ds = PretrainTokenStreamDataset(str(path / split), T=64, device="cpu")
            x, y = ds.get_batch(B=16, generator=torch.Generator().manual_seed(0))
            out += [x.numpy(), y.numpy()]
        return out
    if kind == "sft":
        from niels_gpt.cache.meta import read_meta
        from niels_gpt.cache.sft_dataset import SFTExampleDataset

        eot = read_meta(str(path))["special_token_ids"]["eot"]
        out = []
        for split in ("train", "val"):
            ds = SFTExampleDataset(str(path / f"{split}_tokens.bin"), str(path / f"{split}_idx.npy"), T=128,
                                   device="cpu", eot_id=eot)
            out += [t.numpy() for t in ds.get_batch(B=8, generator=torch.Generator().manual_seed(0))]
        return out
    if kind == "tokenizer":
        from niels_gpt.tokenizer import load_tokenizer

        tok = load_tokenizer(path)
        text = "The quick brown fox: 12 jumps, then a chat turn."
        return [np.array(tok.encode(text)), np.array(sorted((v or -1) for v in tok.special_ids.values()))]
    if kind == "packed":
        from niels_gpt.packing import open_packed

        ds = open_packed(path)
        return [np.concatenate([ds[i]["input_ids"], ds[i]["loss_mask"], ds[i]["seq_boundaries"]])
                for i in range(len(ds))]
    from niels_gpt.cache.formats import detect_format

    info = detect_format(path)
    out = []
    for leaf in (info.splits.values() if info.splits else [info]):
        # copies, not memmaps: the corruption loop rewrites these files in place, and a mapping that outlives
        # a one-byte truncation at a page boundary raises SIGBUS on its last page
        out += [np.array(tf.open()) for tf in leaf.token_files]
        out.append(np.array([-1 if v is None else v for v in (leaf.eot_id, leaf.bos_id, leaf.vocab_size)]))
    return out


def verify_fails(path: Path) -> bool:
    from niels_gpt.report import verify_path

    try:
        problems, _ = verify_path(str(path))
    except NielsGPTError:
        return True
    return bool(problems)


def reader_fails(kind: str, path: Path) -> bool:
    try:
        read_items(kind, path)
    except NielsGPTError:
        return True
    return False


def same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and np.array_equal(x, y) for x, y in zip(a, b, strict=True))


# --- kills ----------------------------------------------------------------------------------------------

def run_kills(work: Path, tok: str, kills: int, rng: random.Random, only: list[str] | None = None
              ) -> tuple[list[dict], dict]:
    ref = work / "REF"
    ref.mkdir()
    rows, clean_time, writing = [], {}, {}
    everything = jobs(tok)
    chosen = [j for j in everything if not only or j.name in only]
    # a chosen job that reads an output in REF (convert, pack-sft) gets the fresh job that writes it built
    # first, so `--only "convert raw"` runs as written
    needed = [j for j in everything if j not in chosen and j.before is None and j.name.endswith("fresh")
              and any(a.startswith(f"REF/{j.output}") for c in chosen for a in c.args)]
    cleans = {}
    for job in needed + chosen:  # the clean builds: the caches in REF itself, the jobs that read them beside it
        here = ref
        if any(a.startswith("REF/") for a in job.args):
            here = Path(tempfile.mkdtemp(dir=work))
            (here / "REF").symlink_to(ref)
        clean_time[job.name], writing[job.name] = run_watched(CLI + job.args, here, here / job.output)
        cleans[job.name] = snapshot(here / job.output)
        if here != ref:  # REF also keeps a copy, for the corruption part
            shutil.copytree(here / job.output, ref / job.output, dirs_exist_ok=True)
            shutil.rmtree(here)
    print("writing time (s, output lock held in the clean run): "
          + ", ".join(f"{k}: {'-' if v is None else f'{v:.3f}'}" for k, v in writing.items()), flush=True)
    totals = Counter()
    for job in chosen:
        clean = cleans[job.name]
        row = Counter()
        for k in range(kills):
            case = Path(tempfile.mkdtemp(dir=work))
            (case / "REF").symlink_to(ref)
            out = case / job.output
            old = None
            if job.before:
                sh(CLI + job.before, case)
                old = snapshot(out)
            held = writing[job.name]
            while_writing = k % 2 == 0 and held is not None
            p = subprocess.Popen(CLI + job.args, cwd=case, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True)
            if while_writing:
                while p.poll() is None and not lock_of(out).exists():
                    time.sleep(0.001)
                time.sleep(rng.uniform(0.0, 0.9) * held)
            else:
                time.sleep(rng.uniform(0.05, 1.1) * clean_time[job.name])
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                row["killed"] += 1
                p.wait()
                row["killed while writing"] += lock_of(out).exists()  # a kill leaves the lock it held
            p.wait()
            now = snapshot(out)
            marked = now is not None and any(m in now for m in MARKERS)
            if marked and now != clean and now != old:
                row["complete-looking partial"] += 1
            if not marked and out.exists():
                row["partial refused by verify"] += verify_fails(out)
                row["partial refused by reader"] += reader_fails(job.kind, out)
                row["partial outputs"] += 1
            if marked and now == old:
                row["old output kept"] += 1
            rerun = sh(CLI + job.args, case, check=False)
            row["reruns"] += 1
            if rerun.returncode != 0:
                row["rerun failed"] += 1
                row.setdefault("rerun errors", []).append(rerun.stderr.strip().splitlines()[-1:])
                shutil.rmtree(case)
                continue
            row["rerun differs from clean"] += snapshot(out) != clean
            row["leftovers after rerun"] += len(leftovers(case))
            shutil.rmtree(case)
        rows.append({"job": job.name, **row})
        totals.update({k: v for k, v in row.items() if isinstance(v, int)})
    return rows, dict(totals)


# --- corruption -----------------------------------------------------------------------------------------

def outputs(ref: Path) -> dict[str, tuple[str, Path]]:
    found = {"pretrain cache": ("pretrain", ref / "c/pretrain/wikitext"), "sft cache": ("sft", ref / "c/sft/oasst1"),
             "packed": ("packed", ref / "packed"), "pretrain zstd": ("pretrain", ref / "conv-niels-zstd")}
    for fmt in FORMATS:
        found[f"convert {fmt}"] = ("pretrain" if fmt == "niels" else "converted", ref / f"conv-{fmt}")
    found["tokenizer"] = ("tokenizer", ref / "tokenizer")
    found.update({"build cache": ("pretrain", ref / "b"), "build chat cache": ("sft", ref / "s"),
                  "trained tokenizer": ("tokenizer", ref / "tk"),
                  "rustbpe tokenizer": ("tokenizer", ref / "tk-rustbpe")})
    return found


def file_kind(f: Path) -> str:
    """What a changed file is, for the per-file-kind figures: a record by its name, data by its suffix."""
    if f.suffix in (".json", ".yaml") or f.suffix == ".model":
        return f.name
    return ".bos.idx" if f.name.endswith(".bos.idx") else f.suffix or f.name


def changes(path: Path, flips: int, rng: random.Random):
    """(description, file, mutate) for byte flips, truncations, extensions and digit edits."""
    files = [p for p in sorted(path.rglob("*")) if p.is_file()]
    for _ in range(flips):
        f = rng.choice(files)
        size = f.stat().st_size
        if size:
            off = rng.randrange(size)
            yield f"flip {f.name}@{off}", f, lambda d, o=off: d[:o] + bytes([d[o] ^ (1 << rng.randrange(8))]) + d[o + 1:]
    for f in files:
        yield f"truncate {f.name}", f, lambda d: d[:-1]
        yield f"extend {f.name}", f, lambda d: d + b"\0"
        if f.suffix in (".json", ".yaml"):
            text = f.read_bytes()
            for m in re.finditer(rb"\d+", text):
                pos = m.end() - 1
                yield (f"digit {f.name}@{pos}", f,
                       lambda d, p=pos: d[:p] + bytes([ord("0") + (d[p] - ord("0") + 1) % 10]) + d[p + 1:])


def run_corruption(ref: Path, flips_per_kind: int, rng: random.Random) -> tuple[list[dict], dict]:
    """(one row per output, {file kind: {changes, caught by verify}})."""
    if (ref / "c/pretrain/wikitext/meta.json").is_file() and not (ref / "conv-niels-zstd").exists():
        # compressed shards (frames + frame index): every frame and index byte is checked on read or by verify
        sh(CLI + ["convert", "c/pretrain/wikitext", "conv-niels-zstd", "--to", "niels", "--compress", "zstd"], ref)
    rows, by_file = [], {}
    for label, (kind, path) in outputs(ref).items():
        if not path.exists():
            continue
        clean_items = read_items(kind, path)
        row: Counter = Counter()
        for what, f, mutate in changes(path, flips_per_kind, rng):
            original = f.read_bytes()
            f.write_bytes(mutate(original))
            try:
                caught_verify = verify_fails(path)
                try:
                    items = read_items(kind, path)
                    caught_open, differs = False, not same(items, clean_items)
                except NielsGPTError:
                    caught_open, differs = True, False
                except Exception:  # noqa: BLE001 - a crash is what the campaign exists to count
                    caught_open, differs = False, False
                    row["reader crashed (not a package error)"] += 1
            finally:
                f.write_bytes(original)
            payload = what.startswith("flip") and _is_payload(kind, f)
            row["changes"] += 1
            row["caught by verify"] += caught_verify
            per = by_file.setdefault(file_kind(f), Counter())
            per["changes"] += 1
            per["caught by verify"] += caught_verify
            row["caught on open"] += caught_open
            if differs and not caught_open:
                key = "silently different: payload" if payload else "silently different: size/count/header"
                row[key] += 1
                if not payload:
                    row.setdefault("examples", [])
                    if len(row["examples"]) < 4:
                        row["examples"].append(what)
            if not caught_verify and (differs or caught_open):
                row["missed by verify but used by a reader"] += 1
        rows.append({"output": label, **row})
    return rows, {k: dict(v) for k, v in sorted(by_file.items())}


def _is_payload(kind: str, f: Path) -> bool:
    if f.suffix in (".json", ".yaml") or f.name.endswith("_idx.npy") or f.name in ("seq_offsets.npy", "seq_starts.npy",
                                                                                   "packed_len.npy"):
        return False
    return f.suffix in (".bin", ".npy") and not f.name.endswith(".idx")


# --- races ----------------------------------------------------------------------------------------------

def _two_builds(args: list[str], cwd: Path, lock: Path, tries: int = 5) -> tuple[list[int], list[str]]:
    """Two builds of one output that overlap for certain: the second starts while the first holds the output's
    lock, the first stopped (SIGSTOP) so that it cannot finish and release it meanwhile, then resumed."""
    for _ in range(tries):
        a = subprocess.Popen(args, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 300
        while a.poll() is None and not lock.exists() and time.monotonic() < deadline:
            time.sleep(0.005)
        held = False
        if a.poll() is None:
            os.kill(a.pid, signal.SIGSTOP)
            held = lock.exists()  # still held now that the first build is stopped
        try:
            if held:
                b = subprocess.Popen(args, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                err_b = b.communicate()[1]
        finally:
            if a.poll() is None:
                os.kill(a.pid, signal.SIGCONT)
        err_a = a.communicate()[1]
        if held:
            return [a.returncode, b.returncode], [err_a, err_b]
    raise RuntimeError(f"races: the first build never held {lock} while running, in {tries} tries")


def run_races(work: Path, tok: str) -> dict:
    d = work / "race"
    d.mkdir()
    args = CLI + ["build-all", "--cache-dir", "c", "--only", "wikitext", "--sample", "--tokenizer", tok,
                  "--no-progress", "--replace-tokenizer"]
    codes, errs = _two_builds(args, d, d / "c/pretrain/wikitext.lock")
    out = {"two builds: exit codes": sorted(codes),
           "two builds: refused with a lock message": sum("another build holds" in e for e in errs),
           "two builds: final cache verifies": not verify_fails(d / "c/pretrain/wikitext")}
    # a reader opening while the cache is rebuilt
    p = subprocess.Popen(args + ["--shard-bytes", "64KB"], cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    served, refused, crashed, seen = 0, 0, 0, []
    while p.poll() is None:
        try:
            read_items("pretrain", d / "c/pretrain/wikitext")
            served += 1
        except NielsGPTError:
            refused += 1
        except Exception as exc:  # noqa: BLE001
            crashed += 1
            seen.append(f"{type(exc).__name__}: {exc}"[:300])
    p.wait()
    out.update({"reader during rebuild: complete caches served": served,
                "reader during rebuild: package errors": refused,
                "reader during rebuild: other exceptions": crashed,
                "reader during rebuild: other exception messages": seen[:3]})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kills", type=int, default=20, help="kills per job (default: 20)")
    ap.add_argument("--flips", type=int, default=20, help="byte flips per output kind (default: 20; 10 kinds)")
    ap.add_argument("--seed", type=int, default=0, help="seed of every random choice (default: 0)")
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    ap.add_argument("--only", nargs="+", default=None, metavar="JOB",
                    help="run only these jobs, by name ('pretrain over', 'convert raw', ...; default: all)")
    ap.add_argument("--train-kills", type=int, default=20, help="kills of `train` (bench/campaign_train.py; runs "
                    "without --only, or with 'train' among its names)")
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="campaign-"))
    try:
        sh(CLI + ["train-tokenizer", "--sample", "--cache-dir", "t", "--vocab-size", "1000",
                  "--tokenizer-max-chars", "500000", "--no-progress"], work)
        tok = str(work / "t/tokenizer/spm.model")
        t0 = time.perf_counter()
        kill_rows, kill_totals = run_kills(work, tok, args.kills, rng, args.only)
        t1 = time.perf_counter()
        shutil.copytree(work / "t/tokenizer", work / "REF/tokenizer")
        corruption, by_file = run_corruption(work / "REF", args.flips, rng)
        t2 = time.perf_counter()
        races = run_races(work, tok)
        print(f"took: kills {t1 - t0:.0f} s, corruption {t2 - t1:.0f} s, races {time.perf_counter() - t2:.0f} s",
              flush=True)
        if not args.only or "train" in args.only:
            from campaign_train import report, run_train_campaign

            train = run_train_campaign(work / "train", kills=args.train_kills, flips=15 * args.flips, seed=args.seed,
                                       tok=tok)
            report(train)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {"kills": kill_rows, "kill_totals": kill_totals, "corruption": corruption, "races": races}
    if not args.only or "train" in args.only:
        result["train"] = train
    print("kills (per job):")
    for r in kill_rows:
        print("  " + ", ".join(f"{k}: {v}" for k, v in r.items()))
    print("kill totals: " + ", ".join(f"{k}: {v}" for k, v in sorted(kill_totals.items())))
    print("corruption (per output):")
    for r in corruption:
        print("  " + ", ".join(f"{k}: {v}" for k, v in r.items()))
    total = Counter()
    for r in corruption:
        total.update({k: v for k, v in r.items() if k not in ("output", "examples")})
    print("corruption totals: " + ", ".join(f"{k}: {v}" for k, v in sorted(total.items())))
    print("corruption per file kind (caught by verify / single changes):")
    for k, v in by_file.items():
        print(f"  {k}: {v.get('caught by verify', 0)} / {v['changes']}")
    print("races: " + ", ".join(f"{k}: {v}" for k, v in races.items()))
    result["corruption_totals"] = dict(total)
    result["corruption_by_file"] = by_file
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
