"""`build` where the nodes share only object storage: s3:// inputs -> s3:// output, inline against 2 workers whose
parts and receipts go through an s3:// work URL.

A moto S3 server on 127.0.0.1 (started here) holds the debian-docs corpus (../shared/data/bulk-text/debian-docs.jsonl,
46 MB) cut into --objects objects (a URL's JSON Lines are one task each, not cut into ranges). Contenders, each one
CLI run as a user types it (`python -m niels_gpt build ...`, the wall time of the whole command: planning, tasks,
commit, upload of the cache):
- inline: `--executor inline` (reads the inputs from the store, uploads the cache);
- processes x2 with a local work directory (`--work-dir /tmp/...`), then through the store (`--work-dir
  s3://.../work`): the difference is the store's round trips (parts uploaded, then read back by the commit);
- Ray x2 through the store: `--executor ray --ray-address local --workers 2 --work-dir s3://.../work` (a Ray
  cluster started by the command: its start is part of the time).
Best of --repeat rounds, interleaved; every cache is compared object by object (sha256) with the inline one.
The tokenizer: a 2,000-piece sentencepiece model trained on the bundled sample corpus (~3 s), or --tokenizer.

    .venv/bin/python bench/bench_store_build.py --repeat 3          # ~3 min on 2 cores
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO.parent / "shared" / "data" / "bulk-text" / "debian-docs.jsonl"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--objects", type=int, default=12, help="objects the corpus is cut into (one task each)")
    ap.add_argument("--tokenizer", default=None)
    args = ap.parse_args(argv)
    if not CORPUS.is_file():
        print(f"{CORPUS} is absent", file=sys.stderr)
        return 1
    import s3fs

    scratch = tempfile.mkdtemp(prefix="bench-store-")
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = {**os.environ, **CREDENTIALS, "FSSPEC_S3_ENDPOINT_URL": endpoint, "PYTHONPATH": str(REPO),
           "NIELS_GPT_CACHE": os.path.join(scratch, "cache")}
    moto = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        fs = s3fs.S3FileSystem(endpoint_url=endpoint, key="testing", secret="testing")
        for _ in range(100):
            try:
                fs.mkdir("bench")
                break
            except Exception:  # noqa: BLE001 (not up yet)
                time.sleep(0.2)
        lines = CORPUS.read_bytes().splitlines(keepends=True)
        step = -(-len(lines) // args.objects)
        for k in range(args.objects):
            fs.pipe_file(f"bench/in/part-{k:03d}.jsonl", b"".join(lines[k * step:(k + 1) * step]))
        tok = args.tokenizer
        if tok is None:
            sys.path.insert(0, str(REPO / "tests"))
            from conftest import sample_texts

            from niels_gpt.tokenizer import TrainSettings, train_tokenizer

            tok = train_tokenizer(sample_texts(), os.path.join(scratch, "tok"),
                                  settings=TrainSettings(vocab_size=2000)).model_path
        base = [sys.executable, "-m", "niels_gpt", "build", "s3://bench/in/", "--tokenizer", str(tok), "--name",
                "debian-docs", "--val-tokens", "50000", "--no-progress"]
        contenders = {
            "inline": ["--executor", "inline"],
            "processes x2, local work directory": ["--executor", "processes", "--workers", "2", "--work-dir",
                                                   os.path.join(scratch, "work")],
            "processes x2, s3 work URL": ["--executor", "processes", "--workers", "2"],
            "ray x2 (local cluster), s3 work URL": ["--executor", "ray", "--ray-address", "local", "--workers", "2"],
        }
        best: dict[str, float] = {}
        digests: dict[str, dict] = {}
        for r in range(args.repeat):
            walls: dict[str, float] = {}  # this round's
            for i, (name, extra) in enumerate(contenders.items()):
                out = f"bench/out-{r}-{i}"
                t0 = time.perf_counter()
                work = [] if "--work-dir" in extra else ["--work-dir", f"s3://{out}.work"]
                p = subprocess.run([*base, "--out", f"s3://{out}", *work, *extra],
                                   env=env, capture_output=True, text=True)
                wall = time.perf_counter() - t0
                if p.returncode:
                    print(p.stderr[-2000:], file=sys.stderr)
                    return 1
                digests[name] = {k[len(out):]: hashlib.sha256(fs.cat_file(k)).hexdigest() for k in fs.find(out)}
                best[name] = min(best.get(name, wall), wall)
                walls[name] = wall
                fs.rm(out, recursive=True)
            same = all(d == digests["inline"] for d in digests.values())
            print(f"round {r + 1}: " + ", ".join(f"{n} {walls[n]:.2f} s" for n in walls) + f"; identical: {same}")
            if not same:
                return 1
        print(f"{CORPUS.name}: {CORPUS.stat().st_size / 1e6:.1f} MB in {args.objects} objects, "
              f"{os.cpu_count()} CPUs; best of {args.repeat}; load average now {os.getloadavg()[0]:.1f}")
        print("| contender | wall s | vs inline |")
        print("|---|---|---|")
        for name, s in best.items():
            print(f"| {name} | {s:.2f} | {best['inline'] / s:.2f}x |")
        return 0
    finally:
        moto.terminate()
        moto.wait(10)
        shutil.rmtree(scratch, ignore_errors=True)  # this run's own scratch directory


if __name__ == "__main__":
    sys.exit(main())
