"""Kill campaign for builds whose work directory is in an object store (moto's S3 server on 127.0.0.1).

Each job is a `build` from s3:// inputs to an s3:// output through an s3:// work URL (Ray with a cluster of its
own, local processes, --chat, --compress zstd). For each kill: the command runs in a process group of its own
and is SIGKILLed at a random moment (0.05-1.1x its clean time); then
- the output prefix holds no complete-looking partial cache (meta.json appears only with the whole cache);
- the same command again succeeds with nothing removed by hand, writes the same objects byte for byte as the
  clean run, reuses receipts the killed run left in the store, and leaves the work URL empty;
- no temporary directory of a task or a staged output stays in the driver's temporary directory.

    .venv/bin/python bench/campaign_store_build.py --kills 4            # ~4 min on 2 cores
    .venv/bin/python bench/campaign_store_build.py --kills 1 --only "processes" --json figures.json
"""

from __future__ import annotations

import argparse
import hashlib
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

REPO = Path(__file__).resolve().parents[1]
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def jobs(tok: str) -> dict[str, list[str]]:
    base = ["--tokenizer", tok, "--no-progress", "--name", "mine", "--task-bytes", "16KB"]
    out = {
        "processes": ["s3://camp/in/", "--val-tokens", "4096", "--executor", "processes", "--workers", "2", *base],
        "chat": ["s3://camp/chat/", "--chat", "--val-frac", "0.2", "--executor", "processes", "--workers", "2", *base],
        "zstd": ["s3://camp/in/", "--compress", "zstd", "--shard-bytes", "64KiB", "--executor", "processes",
                 "--workers", "2", *base],
    }
    if importlib.util.find_spec("ray") is not None:
        out["ray"] = ["s3://camp/in/", "--val-tokens", "4096", "--executor", "ray", "--ray-address", "local",
                      "--workers", "2", *base]
    return out


def snapshot(fs, prefix: str) -> dict[str, str]:
    fs.invalidate_cache()
    try:
        return {k[len(prefix):]: hashlib.sha256(fs.cat_file(k)).hexdigest() for k in fs.find(prefix)}
    except FileNotFoundError:
        return {}


def upload_inputs(fs) -> None:
    sys.path.insert(0, str(REPO / "tests"))
    from conftest import sample_texts

    texts = [t for t in sample_texts() if t.strip()]
    lines = [json.dumps({"text": t[i:i + 2000]}) + "\n" for t in texts for i in range(0, len(t), 2000)]
    for k in range(6):
        fs.pipe_file(f"camp/in/p{k}.jsonl", "".join(lines[k::6]).encode())
    chats = [json.dumps({"messages": [{"role": "user", "content": t[:300]}, {"role": "assistant",
                                                                          "content": t[300:900]}]}) + "\n"
             for t in texts for _ in range(4)]
    for k in range(3):
        fs.pipe_file(f"camp/chat/c{k}.jsonl", "".join(chats[k::3]).encode())


def ours_in_tmp(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith(("niels_gpt_task_", "niels_gpt_stage_")))


def run(kills: int, seed: int, only: list[str] | None) -> dict:
    import s3fs

    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    scratch = Path(tempfile.mkdtemp(prefix="campaign-store-"))
    (scratch / "tmp").mkdir()
    env = {**os.environ, **CREDENTIALS, "FSSPEC_S3_ENDPOINT_URL": endpoint, "PYTHONPATH": str(REPO),
           "TMPDIR": str(scratch / "tmp"), "NIELS_GPT_CACHE": str(scratch / "cache")}
    moto = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    rng = random.Random(seed)
    try:
        fs = s3fs.S3FileSystem(endpoint_url=endpoint, key="testing", secret="testing")
        for _ in range(150):
            try:
                fs.mkdir("camp")
                break
            except Exception:  # noqa: BLE001 (not up yet)
                time.sleep(0.2)
        upload_inputs(fs)
        sys.path.insert(0, str(REPO / "tests"))
        from conftest import sample_texts

        from niels_gpt.tokenizer import TrainSettings, train_tokenizer

        tok = train_tokenizer(sample_texts(), scratch / "tok", settings=TrainSettings(vocab_size=2000)).model_path
        cli = [sys.executable, "-m", "niels_gpt", "build"]
        rows, totals = [], Counter()
        for name, args in jobs(str(tok)).items():
            if only and name not in only:
                continue
            t0 = time.perf_counter()
            clean_out = f"camp/clean-{name}"
            r = subprocess.run([*cli, *args, "--out", f"s3://{clean_out}"], env=env, capture_output=True, text=True)
            if r.returncode:
                raise SystemExit(f"clean build {name} failed: {r.stderr[-2000:]}")
            clean_time = time.perf_counter() - t0
            clean = snapshot(fs, clean_out)
            row = Counter()
            for k in range(kills):
                out = f"camp/{name}-{k}"
                argv = [*cli, *args, "--out", f"s3://{out}"]
                p = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
                time.sleep(rng.uniform(0.05, 1.1) * clean_time)
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)  # the command this campaign started, and its processes
                    row["killed"] += 1
                p.wait()
                now = snapshot(fs, out)
                if "/meta.json" in now and now != clean:
                    row["complete-looking partial"] += 1
                left = [n for n in snapshot(fs, out + ".build") if n.endswith(".json") and "/parts/" in n]
                row["receipts left by the kill"] += len(left)
                r = subprocess.run(argv, env=env, capture_output=True, text=True)
                row["reruns"] += 1
                if r.returncode:
                    row["rerun failed"] += 1
                    row.setdefault("rerun errors", []).append(r.stderr.strip().splitlines()[-1:])
                    continue
                m = re.search(r"(\d+) reused", r.stdout)
                row["receipts reused"] += int(m[1]) if m else 0
                row["rerun differs from clean"] += snapshot(fs, out) != clean
                row["work URL not emptied"] += bool(snapshot(fs, out + ".build"))
                row["leftovers in the temporary directory"] += len(ours_in_tmp(scratch / "tmp"))
            rows.append({"job": name, "clean_s": round(clean_time, 2), **row})
            totals.update({k: v for k, v in row.items() if isinstance(v, int)})
            print(json.dumps(rows[-1]), flush=True)
        return {"kills": rows, "kill_totals": dict(totals)}
    finally:
        moto.terminate()
        moto.wait(10)
        shutil.rmtree(scratch, ignore_errors=True)  # this run's own scratch directory


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kills", type=int, default=4, help="kills per job")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", nargs="*", default=None, help="jobs to run: processes, chat, zstd, ray")
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args(argv)
    figures = run(args.kills, args.seed, args.only)
    print("totals:", json.dumps(figures["kill_totals"]))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    t = figures["kill_totals"]
    bad = sum(t.get(k, 0) for k in ("complete-looking partial", "rerun failed", "rerun differs from clean",
                                     "work URL not emptied", "leftovers in the temporary directory"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
