"""Pretraining cache build speed against the bare tokenizer, and the build's peak RSS as input grows.

On the debian-docs corpus (../shared/data/bulk-text/debian-docs.jsonl, "text" field), one run:
- bare tokenizer: SentencePieceTokenizer.encode on every document, one thread (the reference), and
  encode_batch with 2 threads (the most two workers can get);
- build_pretrain_cache with num_workers=1 and num_workers=2 (encode threads: gigatoken, the fast encoder,
  where it takes the model, as it takes the default BPE; a writer thread overlaps EOTs, range check, sha256
  and writes with encoding);
tokens/s is tokens written / wall time, best of --repeat runs, interleaved so that a noisy
neighbour hurts every contender alike. The tokenizer is a 16k sentencepiece model trained first on
the first --train-chars of the corpus (~10 s).
Peak RSS: builds of N and 10*N documents (the corpus cycled, streamed from disk) each in a fresh
subprocess, ru_maxrss at the end.

    .venv/bin/python bench/bench_cache_build.py                 # ~35 s on 2 cores
    .venv/bin/python bench/bench_cache_build.py --chars 5e6 --repeat 2 --rss-docs 200   # quicker
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_cache_common import table

from niels_gpt.cache.build_cache import build_pretrain_cache
from niels_gpt.tokenizer import TrainSettings, load_tokenizer, train_tokenizer

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "data" / "bulk-text" / "debian-docs.jsonl"
CHARS = 30_000_000
TRAIN_CHARS = 5_000_000
VOCAB = 16_000
REPEAT = 3
RSS_DOCS = 1000


def stream_docs(limit_docs: int | None = None, limit_chars: int | None = None, cycle: bool = False):
    """Documents of the corpus, read line by line (never all at once); cycled when asked."""
    n_docs = n_chars = 0
    while True:
        with open(CORPUS, encoding="utf-8") as f:
            for line in f:
                text = json.loads(line)["text"]
                yield text
                n_docs += 1
                n_chars += len(text)
                if (limit_docs and n_docs >= limit_docs) or (limit_chars and n_chars >= limit_chars):
                    return
        if not cycle:
            return


def build(texts, out: Path, tok, workers: int) -> int:
    # every token goes to train (val budget 0), so the build writes exactly what the bare loop counts
    build_pretrain_cache(texts, str(out), tokenizer=tok, max_train_tokens=10**12, max_val_tokens=0,
                         shard_bytes=128 << 20, seed=0, shuffle_buffer=None, num_workers=workers,
                         dataset_name="debian-docs")
    totals = json.loads((out / "meta.json").read_text())["totals"]
    return totals["train_tokens"] + totals["val_tokens"]


def rss_child(args) -> int:
    tok = load_tokenizer(args.tokenizer)
    n = build(stream_docs(limit_docs=args.rss_child, cycle=True), Path(args.out), tok, 1)
    print(json.dumps({"docs": args.rss_child, "tokens": n,
                      "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--chars", type=float, default=CHARS, help="characters of the corpus to tokenize")
    ap.add_argument("--train-chars", type=float, default=TRAIN_CHARS, help="characters to train the tokenizer on")
    ap.add_argument("--repeat", type=int, default=REPEAT, help="timed runs per contender (best is kept)")
    ap.add_argument("--rss-docs", type=int, default=RSS_DOCS, help="documents of the small RSS build (0: skip)")
    ap.add_argument("--rss-child", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--tokenizer", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rss_child:
        return rss_child(args)
    if not CORPUS.exists():
        print(f"{CORPUS} is absent: nothing to measure")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        tok = train_tokenizer(stream_docs(limit_chars=int(args.train_chars)), work / "tok",
                              settings=TrainSettings(vocab_size=VOCAB))
        print(f"trained a {len(tok)}-id tokenizer on {args.train_chars:,.0f} chars in "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
        texts = list(stream_docs(limit_chars=int(args.chars)))
        print(f"{len(texts)} documents, {sum(map(len, texts)):,} chars", flush=True)

        contenders = {
            "bare encode, 1 thread": lambda: sum(len(tok.encode(t)) + 1 for t in texts),
            "bare encode_batch, 2 threads": lambda: sum(
                len(ids) + 1 for i in range(0, len(texts), 256)
                for ids in tok.encode_batch(texts[i:i + 256], num_threads=2)),
            "build_pretrain_cache, 1 worker": lambda: build(texts, work / "c1", tok, 1),
            "build_pretrain_cache, 2 workers": lambda: build(texts, work / "c2", tok, 2),
        }
        best: dict[str, float] = {}
        tokens: dict[str, int] = {}
        for _ in range(args.repeat):
            for name, fn in contenders.items():
                t0 = time.perf_counter()
                tokens[name] = fn()
                best[name] = min(best.get(name, float("inf")), time.perf_counter() - t0)
        rate = {k: tokens[k] / best[k] for k in best}
        same = {(work / "c1" / f).read_bytes() == (work / "c2" / f).read_bytes()
                for f in ["meta.json", *(str(p.relative_to(work / "c1")) for p in (work / "c1").rglob("*.bin"))]}
        bare, one = rate["bare encode, 1 thread"], rate["build_pretrain_cache, 1 worker"]
        rows = [[k, tokens[k], best[k], rate[k] / 1e6, rate[k] / bare, rate[k] / one] for k in rate]
        print(table(f"\nBuild speed on debian-docs (best of {args.repeat}; tokens include one EOT per document)",
                    ["contender", "tokens", "seconds", "Mtok/s", "x bare 1-thread", "x build 1 worker"], rows))
        print(f"1-worker and 2-worker caches byte-identical: {same == {True}}")

        if args.rss_docs:
            rows = []
            for n in (args.rss_docs, 10 * args.rss_docs):
                out = subprocess.run([sys.executable, __file__, "--rss-child", str(n), "--tokenizer",
                                      str(work / "tok"), "--out", str(work / f"rss{n}")],
                                     check=True, capture_output=True, text=True).stdout
                r = json.loads(out.strip().splitlines()[-1])
                rows.append([r["docs"], r["tokens"], r["maxrss_mb"]])
            rows = [r + [r[2] / rows[0][2]] for r in rows]
            print(table("\nPeak RSS of a build (fresh subprocess each, corpus streamed and cycled, 1 worker)",
                        ["documents", "tokens", "peak RSS MB", "x smallest"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
