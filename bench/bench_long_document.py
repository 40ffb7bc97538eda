"""Peak memory of building a cache from one long single-line document (issue: 30x its size).

Each size runs in a fresh process (ru_maxrss is a high-water mark) and prints the peak RSS, the RSS of
the same process before the build (text in memory, tokenizer loaded), and the ratio of the build's
extra memory to the document's size.

    python bench/bench_long_document.py --mb 40 200 [--tokenizer DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"


def child(mb: int, tokenizer: str, out: str) -> None:
    from niels_gpt.cache.build_cache import build_pretrain_cache
    from niels_gpt.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer)
    base = (SHARED / "tinyshakespeare" / "input.txt").read_text("utf-8").replace("\n", " ")
    text = (base * (mb * 2**20 // len(base) + 1))[: mb * 2**20]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    build_pretrain_cache([text], out, tokenizer=tok, max_train_tokens=10**12, max_val_tokens=0, seed=0, shard_bytes=128 << 20,
                         shuffle_buffer=None, progress=False, num_workers=1)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"mb": mb, "before": before, "peak": peak}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, nargs="+", default=[40])
    p.add_argument("--tokenizer", help="tokenizer dir (default: train a 2,000-piece one on tinyshakespeare)")
    p.add_argument("--child", nargs=3, metavar=("MB", "TOKENIZER", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(int(args.child[0]), args.child[1], args.child[2])
        return
    if not SHARED.is_dir():
        sys.exit(f"{SHARED} is absent: this benchmark reads tinyshakespeare from it")
    with tempfile.TemporaryDirectory() as tmp:
        tok = args.tokenizer
        if tok is None:
            from niels_gpt.tokenizer import TrainSettings, train_tokenizer

            text = (SHARED / "tinyshakespeare" / "input.txt").read_text("utf-8")
            tok = train_tokenizer([text], Path(tmp) / "tok", settings=TrainSettings(vocab_size=2000)).model_path
        print(f"{'document':>10} {'RSS before':>11} {'peak RSS':>10} {'extra/size':>10}")
        for mb in args.mb:
            out = subprocess.run([sys.executable, __file__, "--child", str(mb), str(tok), f"{tmp}/c{mb}"],
                                 capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
            if out.returncode != 0:
                sys.exit(f"the {mb} MB build failed:\n{out.stderr}")
            r = json.loads(out.stdout.strip().splitlines()[-1])
            extra = (r["peak"] - r["before"]) / (mb * 2**20)
            print(f"{mb:>7} MB {r['before'] / 2**20:>8.0f} MB {r['peak'] / 2**20:>7.0f} MB {extra:>9.1f}x")


if __name__ == "__main__":
    main()
