"""What origins cost: bytes of the cache and build time, on the shared real corpora.

Each corpus is built by the one-process builder from its plan's stream twice over, alternately: with origins
(the stream as `build` reads it, `origins.npy` + `origins.json` written) and without (the same items
as a plain iterator: no origins). Prints, per corpus, the origins' share of the cache's bytes (their files and
what they add to meta.json) and the build time with origins against without: CPU seconds of the process and
wall seconds, the least of --repeat builds each (one encode worker; CPU time is the steadier figure on a
shared machine).

    PYTHONPATH=. python bench/bench_origins.py [--work /tmp/bench-origins] [--repeat 5]

The tokenizer is bench/real_tokens.py's (a 16,000-id sentencepiece model of the shared corpora, trained once
per --work directory).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_tokens import SHARED, tokenizer  # noqa: E402  (the benches' tokenizer of the shared corpora)

from niels_gpt.builders.plan import make_plan  # noqa: E402
from niels_gpt.builders.pretrain import build_pretrain_cache  # noqa: E402
from niels_gpt.builders.run import _Reader  # noqa: E402
from niels_gpt.builders.sft import build_sft_cache  # noqa: E402

CORPORA = {  # name -> (inputs under ../shared/data, chat)
    "debian-docs": (["bulk-text/debian-docs.jsonl"], False),
    "web-cc-sample": (["web-cc-sample"], False),
    "gutenberg": (["gutenberg"], False),
    "oasst1": (["oasst1/oasst_pre_release.en_100_tree.jsonl"], True),
    "dolly": (["dolly-15k/databricks-dolly-15k.first34.jsonl"], True),
}
ORIGIN_FILES = ("origins.npy", "origins.json")


def build_once(plan, tok, out: Path, chat: bool, origins: bool) -> tuple[float, float]:
    shutil.rmtree(out, ignore_errors=True)
    reader = _Reader(plan)
    items = reader if origins else iter(reader)  # a plain iterator has no with_origins: no origins written
    t, c = time.perf_counter(), time.process_time()
    if chat:
        build_sft_cache(items, str(out), tokenizer=tok, val_frac=0.1, seed=0, num_workers=1)
    else:
        build_pretrain_cache(items, str(out), tokenizer=tok, max_train_tokens=10**12, max_val_tokens=10_000,
                             shard_bytes=128 << 20, seed=0, shuffle_buffer=None, num_workers=1)
    return time.perf_counter() - t, time.process_time() - c


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default="/tmp/bench-origins")
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    if not SHARED.is_dir():
        raise SystemExit(f"{SHARED} is absent: this bench reads the shared real corpora")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    tok = tokenizer(work)
    print(f"{'corpus':<14} {'docs':>6} {'cache bytes':>12} {'origin bytes':>12} {'bytes %':>8} "
          f"{'cpu s without':>13} {'with':>6} {'cpu %':>7} {'wall s without':>14} {'with':>6} {'wall %':>7}")
    for name, (rel, chat) in CORPORA.items():
        plan = make_plan([SHARED / r for r in rel], tokenizer=tok, chat=chat)
        wall = {True: float("inf"), False: float("inf")}
        cpu = dict(wall)
        for _ in range(args.repeat):
            for origins in (False, True):
                w, c = build_once(plan, tok, work / name, chat, origins)
                wall[origins], cpu[origins] = min(wall[origins], w), min(cpu[origins], c)
                if not origins:
                    plain_meta = (work / name / "meta.json").stat().st_size
        out = work / name  # the last build: with origins
        total = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
        # the origin files, and what they add to meta.json (their records and its `origins`)
        extra = sum((out / f).stat().st_size for f in ORIGIN_FILES) + (out / "meta.json").stat().st_size - plain_meta
        docs = len(np.load(out / ORIGIN_FILES[0]))
        print(f"{name:<14} {docs:>6} {total:>12,} {extra:>12,} {100 * extra / total:>7.2f}% "
              f"{cpu[False]:>13.3f} {cpu[True]:>6.3f} {100 * (cpu[True] / cpu[False] - 1):>+6.2f}% "
              f"{wall[False]:>14.3f} {wall[True]:>6.3f} {100 * (wall[True] / wall[False] - 1):>+6.2f}%")


if __name__ == "__main__":
    main()
