"""`build` end to end through the command line: `--executor ray --workers 2` against `--executor inline --workers 1`.

What a user types, timed from the shell's point of view (interpreter start, imports, `import ray`, joining the
cluster, the new Ray job's worker start, planning, tasks, commit): `python -m niels_gpt build DIR --out OUT
--tokenizer TOK` on debian-docs --copies times over (default 16: 747 MB), the Ray run joining a 2-CPU local
cluster by address (started once in a helper process, as `ray start --head` would be; one throwaway job takes
the workers a new cluster starts for its first job). The two commands alternate for --repeat rounds; the best
of each gives the ratio, and every cache is checked byte for byte against the first.

    .venv/bin/python bench/bench_build_cli.py              # ~20 s a round on 2 cores
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_dist_build import CORPUS, RAY_HELPER, VOCAB, digest, train_texts, wait_quiet

from niels_gpt.tokenizer import TrainSettings, train_tokenizer

PRIME = ("import sys, ray; ray.init(address=sys.argv[1], log_to_driver=False); "
         "ray.get([ray.remote(num_cpus=1)(lambda: None).remote() for _ in range(2)])")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--copies", type=int, default=16, help="the corpus this many times over (links, one input each)")
    ap.add_argument("--repeat", type=int, default=2, help="rounds (the best of each command is kept)")
    args = ap.parse_args(argv)
    if not CORPUS.is_file():
        print(f"{CORPUS} is absent; this benchmark needs ../shared/data")
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="bench-build-cli-"))
    helper = None
    try:
        tok = train_tokenizer(train_texts(), tmp / "tok", settings=TrainSettings(vocab_size=VOCAB))
        (tmp / "input").mkdir()
        for i in range(args.copies):
            (tmp / "input" / f"{CORPUS.stem}-{i}.jsonl").symlink_to(CORPUS)
        helper = subprocess.Popen([sys.executable, "-c", RAY_HELPER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True)
        address = helper.stdout.readline().strip()
        root = str(Path(__file__).resolve().parents[1])
        env = {**os.environ, "RAY_AUTH_MODE": "token", "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
        subprocess.run([sys.executable, "-c", PRIME, address], env=env, stderr=subprocess.DEVNULL, check=True)
        print(f"input: {CORPUS.name} x{args.copies}; ray: local cluster at {address} (2 CPUs)")
        commands = {"inline x1": ["--executor", "inline", "--workers", "1"],
                    "ray x2": ["--executor", "ray", "--workers", "2", "--ray-address", address]}
        times: dict[str, list[float]] = {name: [] for name in commands}
        first = None
        for r in range(args.repeat):
            for name, flags in commands.items():
                out = tmp / "out"
                wait_quiet(60)
                t0 = time.perf_counter()
                run = subprocess.run([sys.executable, "-m", "niels_gpt", "build", str(tmp / "input"), "--out", str(out),
                                      "--tokenizer", tok.model_path, "--name", "debian-docs", "--no-progress", *flags],
                                     env=env, capture_output=True, text=True)
                seconds = time.perf_counter() - t0
                if run.returncode:
                    print(run.stdout[-2000:], run.stderr[-2000:])
                    return 1
                d = digest(out)
                first = first or d
                times[name].append(seconds)
                print(f"  round {r + 1}: {name}: {seconds:.2f} s, cache identical: {d == first}", flush=True)
                if d != first:
                    return 1
                shutil.rmtree(out)
        rounds = ", ".join(f"{a / b:.2f}x" for a, b in zip(times["inline x1"], times["ray x2"], strict=True))
        print(f"best: inline x1 {min(times['inline x1']):.2f} s, ray x2 {min(times['ray x2']):.2f} s = "
              f"{min(times['inline x1']) / min(times['ray x2']):.2f}x; round by round {rounds}")
        return 0
    finally:
        if helper is not None:
            helper.stdin.close()
            helper.wait(timeout=60)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
