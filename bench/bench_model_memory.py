"""A fast encoder model's memory over a build of text whose words are all new: bounded by MODEL_BYTES.

gigatoken's pretoken cache keeps every word a model has met (about 100 bytes each) and is never emptied, so the
library replaces a model once it has encoded `niels_gpt.tokenizer.fast.MODEL_BYTES` of text. This script builds
--mb megabytes of random 9-letter words (JSON Lines, documents of 64 KB; every word new to the model) with
`build --executor processes --workers 2` and the tokenizer of bench_fast_encoder.py's kind (a 16k byte-level
BPE trained on debian-docs, as a .tiktoken file), once with the bound set to --bound-mb and once without a bound
(as before it existed), and prints the largest resident set of the build's processes (the driver and its
workers) for each. The caches are compared byte for byte. No network.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def corpus(folder: Path, mb: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    words_per_doc = 64_000 // 10
    with open(folder / "words.jsonl", "w", encoding="ascii") as f:
        for _ in range(mb * 1_000_000 // 64_000):
            letters = rng.integers(ord("a"), ord("z") + 1, size=(words_per_doc, 10), dtype=np.uint8)
            letters[:, 9] = ord(" ")
            f.write(json.dumps({"text": letters.tobytes().decode("ascii")}) + "\n")


def build(tok: Path, src: Path, out: Path, bound: int | None) -> tuple[float, float]:
    """(wall seconds, the largest RSS in MB of the build's process tree)."""
    code = ("import sys\nfrom niels_gpt.tokenizer import fast\n"
            + (f"fast.MODEL_BYTES = {bound}\n" if bound else "fast.MODEL_BYTES = 1 << 62\n")
            + "from niels_gpt.cli import main\n"
            f"sys.exit(main(['build', '--out', {str(out)!r}, '--tokenizer', {str(tok)!r}, '--executor', 'processes', "
            f"'--workers', '2', '--no-progress', {str(src)!r}]))\n")
    t0 = time.perf_counter()
    # each build in its own shell, whose resource usage covers the build and its workers alone
    run = subprocess.run(["bash", "-c", f'{sys.executable} -c "$0"; python3 -c "import resource; '
                          'print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"', code],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if run.returncode:
        raise SystemExit(run.stderr[-3000:])
    return time.perf_counter() - t0, int(run.stdout.split()[-1]) / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=256, help="megabytes of random words to build")
    ap.add_argument("--bound-mb", type=int, default=32, help="MODEL_BYTES for the bounded build, in MiB")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "bench"))
    import bench_fast_encoder as bfe

    with tempfile.TemporaryDirectory(prefix="bench-model-mem-") as tmp:
        tmp = Path(tmp)
        tok = bfe.train(bfe.read_docs(), 3_000_000, 16_000, tmp)["tiktoken"]
        corpus(tmp / "words", args.mb)
        print(f"{args.mb} MB of random 9-letter words; 2 worker processes")
        rows = {}
        for label, bound in ((f"MODEL_BYTES {args.bound_mb} MiB", args.bound_mb << 20), ("no bound", None)):
            rows[label] = build(tok, tmp / "words", tmp / f"out-{bound}", bound)
            print(f"{label:22s} {rows[label][0]:7.1f} s  largest process {rows[label][1]:8.0f} MB")
        same = all(filecmp.cmp(a, tmp / "out-None" / a.relative_to(tmp / f"out-{args.bound_mb << 20}"), shallow=False)
                   for a in (tmp / f"out-{args.bound_mb << 20}").rglob("*.bin"))
        print(f"caches' token files byte-identical: {same}")


if __name__ == "__main__":
    main()
