"""`build` speed on every executor: inline, local processes and Ray with 1 and 2 workers.

On the debian-docs corpus (../shared/data/bulk-text/debian-docs.jsonl, 46 MB, "text" field) --copies times over
(16 by default: 747 MB, ~9 s inline on 2 cores with the fast encoder, cut into build's default 64 tasks), one run:
- the reference: `build --executor inline --workers 1` (the one-process builder reading the plan; its writer
  thread overlaps sha256 and writes with encoding);
- the plan's tasks run one after another in this process (`inprocess`, the parallel path without a pool),
  with 1 and 2 local processes, and with 1 and 2 Ray tasks at once on a local Ray cluster (2 CPUs) started once in a helper process and joined by address from a
  driver process of its own: once as one CLI run does it (a new Ray job per build, whose worker
  processes start and import the package: a fixed cost per build, 1.5-2 s on 2 cores, so --copies 4 shows it
  weighing four times as much as --copies 16), once in a warm job (the workers already running, as for the
  second and later tasks of a long build). Before any timing, one throwaway job takes the workers a new cluster
  starts for its first job, so no timed "new job" run finds workers already started;
tokens/s is cache tokens / wall time of the whole call (planning, tasks, commit, meta.json), best of
--repeat rounds, contenders interleaved so a noisy neighbour hurts each alike; before each call the
script waits (up to --quiet-wait s) for the machine's CPUs to be >= 90% idle, and says when they were not. Every cache is checked
byte for byte (sha256 of each file) against the reference. The tokenizer is a 16k sentencepiece
model trained first on the first --train-chars of the corpus (~10 s), or --tokenizer.

    .venv/bin/python bench/bench_dist_build.py                       # ~3.5 min on 2 cores
    .venv/bin/python bench/bench_dist_build.py --only x2             # the 2-worker contenders: ~2 min
    .venv/bin/python bench/bench_dist_build.py --copies 4 --repeat 1 --no-ray   # quicker
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_cache_common import table

from niels_gpt.builders.plan import make_plan
from niels_gpt.builders.run import BuildSpec, build
from niels_gpt.tokenizer import TrainSettings, load_tokenizer, train_tokenizer

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "data" / "bulk-text" / "debian-docs.jsonl"
TRAIN_CHARS = 5_000_000
VOCAB = 16_000
REPEAT = 2
COPIES = 16
SETTINGS = {"max_tokens": 10**12, "val_tokens": 0, "shard_bytes": 128 << 20, "seed": 0, "name": "debian-docs"}
RAY_HELPER = """
import sys, ray
ctx = ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
print(ctx.address_info["gcs_address"], flush=True)
sys.stdin.read()
ray.shutdown()
"""
# A Ray driver of its own (this process never imports ray, so its process pools fork cleanly). Per
# request: "fresh" = what one CLI run does (join the cluster, a new Ray job whose workers start and
# import the package, leave); "warm" = builds one after another in one job, workers already running.
RAY_DRIVER = """
import json, sys, time
import ray
from niels_gpt.builders.run import BuildSpec, build
args = json.loads(sys.argv[1])
# the throwaway job: a new cluster starts a worker per CPU for the first job that comes; take them here
ray.init(address=args["address"], log_to_driver=False, configure_logging=False)
ray.get([ray.remote(num_cpus=1)(lambda: None).remote() for _ in range(2)])
ray.shutdown()
print("primed", flush=True)
for line in sys.stdin:
    req = json.loads(line)
    if req["warm"] and not ray.is_initialized():
        ray.init(address=args["address"], log_to_driver=False, configure_logging=False)
    if not req["warm"] and ray.is_initialized():
        ray.shutdown()
    t0 = time.perf_counter()
    s = build(BuildSpec(sources=args["inputs"], out=req["out"], tokenizer=args["tokenizer"], executor="ray",
                        workers=req["workers"], ray_address=args["address"], task_bytes=args["task_bytes"],
                        **args["settings"]), log=lambda m: None)
    print(json.dumps({"seconds": time.perf_counter() - t0, "summary": s}), flush=True)
"""


def docs(paths=(CORPUS,)):
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                yield json.loads(line)["text"]


def train_texts(chars: float = TRAIN_CHARS):
    """The corpus's first documents, up to `chars` characters: what the benchmarks' tokenizer trains on."""
    n = 0
    for d in docs():
        yield d
        n += len(d)
        if n >= chars:
            return


def cpu_idle(seconds: float = 0.5) -> float:
    """Fraction of CPU time idle across the machine over `seconds` (/proc/stat), 1.0 where unknown."""
    def sample():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return v[3] + v[4], sum(v)
    try:
        i0, t0 = sample()
        time.sleep(seconds)
        i1, t1 = sample()
    except OSError:
        return 1.0
    return (i1 - i0) / max(t1 - t0, 1)


def wait_quiet(limit_s: float) -> float:
    """Wait (at most limit_s) until other jobs leave >= 90% of the CPUs idle; returns the last idle share."""
    deadline = time.monotonic() + limit_s
    idle = cpu_idle()
    while idle < 0.9 and time.monotonic() < deadline:
        idle = cpu_idle()
    return idle


def digest(out: Path) -> dict[str, str]:
    return {p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.rglob("*")) if p.is_file()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--repeat", type=int, default=REPEAT, help="rounds (best of each contender is kept)")
    ap.add_argument("--task-bytes", type=int, default=None,
                    help="input bytes per task (default: build's, about 64 tasks of 4-64 MiB)")
    ap.add_argument("--tokenizer", default=None, help="a trained model to use instead of training one")
    ap.add_argument("--train-chars", type=float, default=TRAIN_CHARS)
    ap.add_argument("--no-ray", action="store_true", help="leave the Ray contenders out")
    ap.add_argument("--only", nargs="+", metavar="TEXT", default=None,
                    help="run only the contenders whose name contains one of these (the two in-process ones, the "
                         "ratios' baselines, always run)")
    ap.add_argument("--copies", type=int, default=COPIES,
                    help="the input is the corpus this many times over (links to it, one input each): a build long "
                         "enough that the fixed costs (pool or Ray job start, the last task's tail) weigh as in a "
                         "real build; 1 = the corpus once (~1.8 s in-process on 2 cores)")
    ap.add_argument("--quiet-wait", type=float, default=60.0,
                    help="before each timed call, wait up to this many seconds for the CPUs to be >= 90%% idle")
    args = ap.parse_args(argv)
    if not CORPUS.is_file():
        print(f"{CORPUS} is absent; this benchmark needs ../shared/data")
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="bench-dist-"))
    if args.tokenizer is None:
        t0 = time.perf_counter()
        tok = train_tokenizer(train_texts(args.train_chars), tmp / "tok", settings=TrainSettings(vocab_size=VOCAB))
        print(f"tokenizer: {len(tok)} ids trained in {time.perf_counter() - t0:.1f} s")
    else:
        tok = load_tokenizer(args.tokenizer)
    inputs = [CORPUS]
    if args.copies > 1:
        (tmp / "input").mkdir()
        inputs = [tmp / "input" / f"{CORPUS.stem}-{i}.jsonl" for i in range(args.copies)]
        for link in inputs:
            link.symlink_to(CORPUS)
    plan = make_plan(inputs, tokenizer=tok, task_bytes=args.task_bytes)
    print(f"input: {CORPUS.name} x{len(inputs)}, {len(inputs) * CORPUS.stat().st_size / 1e6:.1f} MB, "
          f"{len(plan.tasks)} tasks of ~{plan.task_bytes / 2**20:.1f} MiB")

    helper = None
    ray_address = None
    if not args.no_ray:
        helper = subprocess.Popen([sys.executable, "-c", RAY_HELPER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True)
        ray_address = helper.stdout.readline().strip()
        os.environ.setdefault("RAY_AUTH_MODE", "token")  # the helper's cluster authenticates by token
        print(f"ray: local cluster at {ray_address} (2 CPUs)")

    def reference(out):
        return build(BuildSpec(sources=[str(p) for p in inputs], out=str(out), tokenizer=tok.model_path,
                               executor="inline", workers=1, task_bytes=args.task_bytes, **SETTINGS), log=lambda m: None)

    def dist(executor, workers):
        def run(out, keep_parts=False):
            return build(BuildSpec(sources=[str(p) for p in inputs], out=str(out), keep_parts=keep_parts,
                                   tokenizer=tok.model_path, executor=executor, workers=workers,
                                   task_bytes=args.task_bytes, **SETTINGS), log=lambda m: None)
        return run

    driver = None

    def ray_run(workers, warm):
        def run(out, keep_parts=False):
            driver.stdin.write(json.dumps({"workers": workers, "out": str(out), "warm": warm}) + "\n")
            driver.stdin.flush()
            reply = json.loads(driver.stdout.readline())
            return {**reply["summary"], "driver_seconds": reply["seconds"]}
        return run

    contenders = [("build inline", 1, reference), ("build, tasks in this process", 1, dist("inprocess", 1)),
                  ("build inline (encode threads)", 2, dist("inline", 2)),
                  ("build processes", 1, dist("processes", 1)), ("build processes", 2, dist("processes", 2))]
    if ray_address:
        conf = {"address": ray_address, "inputs": [str(p) for p in inputs], "tokenizer": tok.model_path,
                "task_bytes": args.task_bytes, "settings": SETTINGS}
        driver = subprocess.Popen([sys.executable, "-c", RAY_DRIVER, json.dumps(conf)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        if driver.stdout.readline().strip() != "primed":
            raise SystemExit("the Ray driver did not start")
        contenders += [("build ray, a new job per build", 1, ray_run(1, False)),
                       ("build ray, a new job per build", 2, ray_run(2, False)),
                       ("build ray, warm job", 1, ray_run(1, True)),
                       ("build ray, warm job", 2, ray_run(2, True))]
    if args.only:
        contenders = contenders[:2] + [c for c in contenders[2:] if any(t in f"{c[0]} x{c[1]}" for t in args.only)]
    best: dict[int, float] = {}
    per_worker: dict[int, float] = {}
    tokens = 0
    digests: dict[int, dict] = {}
    try:
        for r in range(args.repeat):
            for i, (name, workers, run) in enumerate(contenders):
                out = tmp / f"c{i}"
                idle = wait_quiet(args.quiet_wait)
                t0 = time.perf_counter()
                summary = run(out)
                # a Ray contender is timed in its own driver process: the call, not the pipe
                dt = summary["driver_seconds"] if summary and "driver_seconds" in summary else time.perf_counter() - t0
                best[i] = min(best.get(i, float("inf")), dt)
                if summary and summary.get("task_seconds"):
                    rate = summary["tokenized"] / summary["task_seconds"]
                    per_worker[i] = max(per_worker.get(i, 0.0), rate)
                meta = json.loads((out / "meta.json").read_text())
                tokens = meta["totals"]["train_tokens"] + meta["totals"]["val_tokens"]
                digests[i] = digest(out)
                busy = f" (started with only {idle:.0%} of the CPUs idle)" if idle < 0.9 else ""
                print(f"  round {r + 1}: {name} x{workers}: {dt:.2f} s{busy}", flush=True)
        # The commit alone: every receipt valid, so a rerun plans, reads the parts and writes the cache.
        commit_out = tmp / "commit"
        dist("inprocess", 1)(commit_out, keep_parts=True)
        commit_s = min(dist("inprocess", 1)(commit_out, keep_parts=True)["wall_seconds"] for _ in range(3))
    finally:
        if driver is not None:
            driver.stdin.close()
            driver.wait(timeout=60)
        if helper is not None:
            helper.stdin.close()
            helper.wait(timeout=60)
        shutil.rmtree(tmp, ignore_errors=True)
    base = tokens / best[0]
    inproc = tokens / best[1]
    rows = []
    for i, (name, workers, _) in enumerate(contenders):
        rate = tokens / best[i]
        same = "yes" if digests[i] == digests[0] else "NO"
        task_rate = f"{per_worker[i] / 1e6:.2f}" if i in per_worker else "-"
        rows.append([name, str(workers), f"{rate / 1e6:.2f}", f"{rate / base:.2f}x",
                     f"{rate / base / workers:.2f}", f"{rate / inproc:.2f}x", task_rate, same])
    print()
    print(table(f"{tokens:,} tokens; best of {args.repeat}; ratio against build --executor inline --workers 1",
                ["contender", "workers", "Mtok/s", "ratio", "efficiency", "x tasks in this process",
                 "Mtok/s per task-second", "identical"], rows))
    print(f"input: {len(inputs) * CORPUS.stat().st_size / tokens:.2f} bytes of JSONL per token")
    print(f"commit alone (rerun, every receipt valid): {commit_s:.3f} s = {tokens / commit_s / 1e6:.0f} Mtok/s "
          f"= {tokens * 2 / commit_s / 1e6:.0f} MB/s of uint16 shards")
    return 0 if all(d == digests[0] for d in digests.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
