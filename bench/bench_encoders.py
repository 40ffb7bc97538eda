"""The bare encoders, no cache: sentencepiece against tiktoken on the same text, and tiktoken on two threads
against two processes.

1. chars/s of one thread on three real corpora of ../shared/data (Gutenberg paragraphs, debian-docs
   documents, wikitext articles): a sentencepiece unigram model trained here on the corpus itself
   (--vocab) and a tiktoken encoding (--tiktoken, default cl100k_base: its file must be in tiktoken's
   cache, TIKTOKEN_CACHE_DIR, or downloadable). Best of --repeat.
2. tiktoken on debian-docs: one thread, two threads of one process, two forked processes (each half of
   the documents, `encode_to_tiktoken_buffer` as the cache builder calls it). This is why the builder's
   tiktoken workers are processes (niels_gpt/builders/encode_pool.py).

Figures on the project's 2-core VM (`TIKTOKEN_CACHE_DIR=... PYTHONPATH=. .venv/bin/python
bench/bench_encoders.py`, two runs plus the same measurements run by hand before the script), cl100k_base
against an 8k unigram: tiktoken / sentencepiece 0.73-0.76x on Gutenberg, 0.62-0.64x on debian-docs,
0.75x on wikitext (sentencepiece ~28-30 M chars/s, cl100k_base ~18-22 M); tiktoken on 2 threads 1.35-1.43x
one thread, on 2 processes 1.76-1.91x.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

from bench_cache_build import CORPUS
from bench_cache_common import timed

from niels_gpt.tokenizer import TrainSettings, load_tokenizer, train_tokenizer

DATA = CORPUS.parents[1]
_ENC = None


def gutenberg() -> list[str]:
    out = []
    for f in sorted((DATA / "gutenberg").glob("*.txt")):
        out += [p for p in f.read_text(encoding="utf-8-sig").split("\r\n\r\n") if p.strip()]
    return out


def debian(chars: float = 1e7) -> list[str]:
    out, n = [], 0
    with open(CORPUS, encoding="utf-8") as f:
        for line in f:
            out.append(json.loads(line)["text"])
            n += len(out[-1])
            if n > chars:
                break
    return out


def wikitext() -> list[str]:
    text = (DATA / "wikitext" / "wikitext-2-raw.wiki.valid.raw").read_text(encoding="utf-8")
    return [a for a in text.split("\n \n") if a.strip()]


def _encode(docs: list[str]) -> int:
    core = _ENC._enc._core_bpe
    return sum(memoryview(core.encode_to_tiktoken_buffer(t, set())).nbytes for t in docs)


def main(argv: list[str] | None = None) -> int:
    global _ENC
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiktoken", default="cl100k_base", help="a tiktoken encoding name or .tiktoken file")
    ap.add_argument("--vocab", type=int, default=8000, help="the sentencepiece models' vocabulary")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    if not CORPUS.exists():
        print(f"{CORPUS} is absent: nothing to measure")
        return 1
    _ENC = tt = load_tokenizer(args.tiktoken)
    print("1. one thread, chars/s")
    for name, docs in (("gutenberg", gutenberg()), ("debian-docs", debian()), ("wikitext", wikitext())):
        n = sum(map(len, docs))
        with tempfile.TemporaryDirectory() as tmp:
            spm = train_tokenizer(docs, Path(tmp) / "spm", settings=TrainSettings(vocab_size=args.vocab))
            rate = {k: n / timed(lambda tok=tok, docs=docs: tok.encode_batch(docs, num_threads=1), repeat=args.repeat)
                    for k, tok in (("sentencepiece", spm), ("tiktoken", tt))}
        print(f"  {name}: {n:,} chars; sentencepiece {rate['sentencepiece'] / 1e6:.1f} M chars/s, "
              f"{args.tiktoken} {rate['tiktoken'] / 1e6:.1f} M: tiktoken / sentencepiece "
              f"{rate['tiktoken'] / rate['sentencepiece']:.2f}x", flush=True)
    docs = debian(5e6)
    halves = [docs[0::2], docs[1::2]]
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as procs, \
            ThreadPoolExecutor(2) as threads:
        list(procs.map(_encode, [docs[:2], docs[2:4]]))  # the workers are up before timing
        one = timed(lambda: _encode(docs), repeat=args.repeat)
        two_threads = timed(lambda: list(threads.map(_encode, halves)), repeat=args.repeat)
        two_procs = timed(lambda: list(procs.map(_encode, halves)), repeat=args.repeat)
    print(f"2. {args.tiktoken} on debian-docs ({sum(map(len, docs)):,} chars): one thread "
          f"{sum(map(len, docs)) / one / 1e6:.1f} M chars/s; 2 threads {one / two_threads:.2f}x; "
          f"2 processes {one / two_procs:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
