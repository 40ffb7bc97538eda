"""The on-the-fly Parquet loader behind a simulated training step, pinned to one core: how much of the time the
loop is fed, with the fast encoder and with each tokenizer's own library, in one run.

    python bench/bench_parquet_feed.py            # ~1 min on 2 cores; needs no network

The documents are bench_loading.py's section 4 corpora (the sample corpus's paragraphs, and wikitext-2
articles where ../shared/data is present), in four Parquet shards. Tokenizers trained here on that text:
a byte-level BPE as a .tiktoken file and sentencepiece BPE (the fast encoder encodes both), and the
library's unigram model (`--model-type unigram`: its own library only). For each: the ParquetTokenLoader with its defaults
(prefetch 4, a thread) and in the loop (prefetch=0), B=32, T=1024, contiguous packing, a --step-ms step
(the CPU idle, as while a GPU computes): the mean wait in next() and the share of the time fed,
step / (step + wait); and the tokens/s it delivers with no step at all.

`--python-ms N`: the first N ms of each step are Python work (a fixed amount, calibrated alone: the loop's
kernel launches and bookkeeping, which need the GIL), the rest idle. A loader thread that holds the GIL then
lengthens the step without any wait in next(), so each row also gives the mean step, next() included, against
the same step with no loader at all (the honest stall).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def tokenizers(texts: list[str], out: Path) -> dict[str, Path]:
    from bench_fast_encoder import train

    paths = train(texts, 3_000_000, 8_000, out)
    from niels_gpt.tokenizer import TrainSettings, train_tokenizer

    unigram = train_tokenizer(texts[:4000], out / "unigram",  # (the library trains BPE by default)
                              settings=TrainSettings(vocab_size=8000, model_type="unigram"))
    return {"tiktoken BPE": paths["tiktoken"], "sentencepiece BPE": paths["sentencepiece"],
            "sentencepiece unigram": Path(unigram.model_path)}


def python_step(python_ms: float, step: float):
    """A simulated step: `python_ms` of Python work (a fixed amount, calibrated with nothing else running),
    then idle to `step` seconds as measured alone."""
    def spin(n: int) -> int:
        x = 0
        for i in range(n):
            x += i
        return x

    t0 = time.perf_counter()
    spin(200_000)
    per_ms = int(200_000 / ((time.perf_counter() - t0) * 1e3))
    n, idle = int(per_ms * python_ms), max(0.0, step - python_ms / 1e3)

    def one() -> None:
        spin(n)
        time.sleep(idle)
    return one


def mean_step(make, one_step, steps: int) -> float:
    """Mean seconds of next() plus `one_step()` over `steps` steps after 3 of warm-up; `make` None: no loader."""
    loader = iter(make()) if make is not None else None
    for _ in range(3):
        if loader is not None:
            next(loader)
        one_step()
    t0 = time.perf_counter()
    for _ in range(steps):
        if loader is not None:
            next(loader)
        one_step()
    dt = (time.perf_counter() - t0) / steps
    getattr(loader, "close", lambda: None)()
    return dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--B", type=int, default=32)
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--step-ms", type=float, default=30.0)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--python-ms", type=float, default=0.0,
                    help="the first N ms of each step are Python work that needs the GIL (0: the step is idle)")
    ap.add_argument("--all-cores", action="store_true", help="do not pin the process to one core")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity") and not args.all_cores:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core, every thread of this process
    import pyarrow as pa
    import pyarrow.parquet as pq
    from bench_loading import _feed_once, feed_corpora

    from niels_gpt.loading import ParquetTokenLoader
    from niels_gpt.tokenizer import load_tokenizer
    from niels_gpt.tokenizer.fast import fast_encoder

    corpora = feed_corpora()
    B, T, step = args.B, args.T, args.step_ms / 1e3
    work_step = python_step(args.python_ms, step)
    alone = min(mean_step(None, work_step, args.steps) for _ in range(args.repeat)) if args.python_ms else None
    print(f"Parquet loader, {len(os.sched_getaffinity(0))} core(s) in its affinity, B={B}, T={T}, "
          f"{args.step_ms:.0f} ms step, contiguous packing")
    if alone is not None:
        print(f"  the step with {args.python_ms:g} ms of Python and no loader: {1e3 * alone:.2f} ms")
    print(f"  {'corpus':<25} {'tokenizer':<22} {'encoder':<16} {'loader':<18} {'wait ms':>8} {'fed %':>7} "
          f"{'Mtok/s':>7}")
    with tempfile.TemporaryDirectory(prefix="bench-feed-") as tmp:
        work = Path(tmp)
        (work / "tok").mkdir()
        paths = tokenizers([t for docs in corpora.values() for t in docs], work / "tok")
        for name, docs in corpora.items():
            d = work / name.replace(" ", "_")
            d.mkdir()
            for i in range(4):
                pq.write_table(pa.table({"text": docs[i::4]}), d / f"shard_{i:05d}.parquet", row_group_size=64)
            files = sorted(d.glob("*.parquet"))[:-1]
            for kind, path in paths.items():
                tok = load_tokenizer(path)
                encoder = fast_encoder(tok).name if fast_encoder(tok) else "its own library"
                bos = tok.bos_id if tok.bos_id is not None else 0
                for label, kw in (("defaults (ahead)", {}), ("in the loop", {"prefetch": 0})):
                    def make(kw=kw, tok=tok, bos=bos, files=files):
                        return ParquetTokenLoader(files, tok, B, T, packing="contiguous", rank=0, world_size=1,
                                                  bos_id=bos, **kw)

                    if alone is not None:
                        with_loader = min(mean_step(make, work_step, args.steps) for _ in range(args.repeat))
                        print(f"  {name:<25} {kind:<22} {encoder:<16} {label:<18} step {1e3 * with_loader:7.2f} ms: "
                              f"+{1e3 * (with_loader - alone):.2f} ms ({100 * alone / with_loader:.2f}% fed)",
                              flush=True)
                        continue
                    runs = [_feed_once(make, B * T, step, args.steps) for _ in range(args.repeat)]
                    wait, rate = min(w for w, _ in runs), max(r for _, r in runs)
                    print(f"  {name:<25} {kind:<22} {encoder:<16} {label:<18} {1e3 * wait:8.2f} "
                          f"{100 * step / (step + wait):7.2f} {rate / 1e6:7.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
