"""Each way to run gigatoken on these cores, over the same documents, encoding each once (a fresh encoder per
pass, best of --repeat): how much a second core gives the bare encoder, and what parsing JSON Lines in Rust
(`encode_files`) gives against msgspec + `encode` from Python strings. Figures: docs/performance.md.

    python bench/bench_encode_ways.py --corpora debian-docs,all-text-x4

1. one thread, `encode` per document (what one build encode thread does);
2. two threads sharing one encoder, `encode` per document on runs of a batch (the builder's encode pool);
3. `encode_batch(parallel=True)` per 256 documents, split into one array per document;
4. two threads sharing one encoder, `encode_batch(parallel=False)` per run, split the same way;
5. two threads, an encoder each, `encode` per document (it holds the GIL: "cores busy", CPU seconds per second,
   stays near 1);
6. two threads, an encoder each, `encode_batch(parallel=False)` per run (it releases the GIL);
7. two threads, an encoder each, `encode_batch_padded([document], parallel=False)` per document: it releases the
   GIL and returns a numpy row (given str, gigatoken still imports awkward on the first call; given a
   `BytesSource` of UTF-8 buffers it does not), so a builder thread could call it per document as it calls `encode`;
8. debian-docs only: `encode_files(JsonlFileSource)` parsing the file in Rust, parallel and not, and the msgspec
   parse alone.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from bench_fast_encoder import SHARED, batches, best, corpus, read_docs, train


def runs(docs: list[str], per_batch: int) -> list[list[str]]:
    out = []
    for b in batches(docs):
        k = max(1, len(b) // per_batch)
        out += [b[i:i + k] for i in range(0, len(b), k)]
    return out


def per_document(arr) -> list[np.ndarray]:
    """An awkward array of token lists as numpy views, one per document (its flat content and offsets)."""
    content, offsets = np.asarray(arr.layout.content.data), np.asarray(arr.layout.offsets.data)
    return [content[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]


def ways(fresh, docs: list[str]) -> dict:
    from gigatoken.gigatoken_rs import PadTruncate

    pieces = runs(docs, 4)

    def shared_encode(g):
        with ThreadPoolExecutor(2) as pool:
            return sum(len(x) for r in pool.map(lambda run: [g.encode(d) for d in run], pieces) for x in r)

    def shared_batch(g):
        with ThreadPoolExecutor(2) as pool:
            work = pool.map(lambda run: per_document(g.encode_batch(run, parallel=False)), pieces)
            return sum(len(x) for r in work for x in r)

    def padded(g, doc: str) -> np.ndarray:
        rows, n = g.backend.encode_batch_padded([doc], PadTruncate(0), parallel=False)
        return rows.reshape(-1)[:int(n[0])]

    def encoder_each(_, batch: str = ""):
        encoders, local, order = [fresh(), fresh()], threading.local(), iter(range(2))

        def run(r):
            if not hasattr(local, "g"):
                local.g = encoders[next(order)]
            if batch == "padded":
                return [padded(local.g, d) for d in r]
            return per_document(local.g.encode_batch(r, parallel=False)) if batch else [local.g.encode(d) for d in r]
        with ThreadPoolExecutor(2) as pool:
            return sum(len(x) for r in pool.map(run, pieces) for x in r)

    return {
        "one thread, encode": lambda g: sum(len(g.encode(d)) for d in docs),
        "two threads, one encoder, encode": shared_encode,
        "encode_batch(parallel=True), split per document": lambda g: sum(
            len(x) for b in batches(docs) for x in per_document(g.encode_batch(b, parallel=True))),
        "two threads, one encoder, encode_batch(parallel=False)": shared_batch,
        "two threads, an encoder each, encode": encoder_each,
        "two threads, an encoder each, encode_batch(parallel=False)": lambda g: encoder_each(g, "batch"),
        "two threads, an encoder each, encode_batch_padded per document": lambda g: encoder_each(g, "padded"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpora", default="debian-docs,all-text-x4")
    ap.add_argument("--train-chars", type=int, default=3_000_000)
    ap.add_argument("--vocab", type=int, default=16_000)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()

    import awkward
    import gigatoken
    import msgspec

    with tempfile.TemporaryDirectory(prefix="bench-ways-") as tmp:
        tiktoken_file = str(train(read_docs(), args.train_chars, args.vocab, Path(tmp))["tiktoken"])

        def fresh():
            return gigatoken.Tokenizer.from_tiktoken(tiktoken_file, pretokenizer="gpt4", special_tokens={})

        print(f"{os.cpu_count()} cores; a fresh encoder each pass, best of {args.repeat}")
        for name in args.corpora.split(","):
            files = corpus(name)
            docs = [d for stem in sorted(files) for d in files[stem]]
            print(f"\n{name}: {len(docs):,} documents, {sum(map(len, docs)) / 1e6:.1f} M characters")
            for label, fn in ways(fresh, docs).items():
                dt, n, cpu = best(fn, args.repeat, fresh)
                print(f"  {label:60s} {n / dt / 1e6:7.1f} Mtok/s, {cpu / dt:4.2f} cores busy")
        path = SHARED / "bulk-text" / "debian-docs.jsonl"
        print(f"\n{path.name}, parsed and encoded:")
        for parallel in (True, False):
            source = gigatoken.JsonlFileSource([str(path)], field="text")
            dt, n, _ = best(lambda g, p=parallel, s=source: int(awkward.count(g.encode_files(s, parallel=p))),
                            args.repeat, fresh)
            print(f"  encode_files(JsonlFileSource, parallel={parallel}){'':23s} {n / dt / 1e6:7.1f} Mtok/s")
        decoder = msgspec.json.Decoder()
        t0 = time.perf_counter()
        with open(path, "rb") as f:
            texts = [decoder.decode(line)["text"] for line in f]
        print(f"  msgspec parse alone: {time.perf_counter() - t0:.3f} s for {len(texts):,} documents")


if __name__ == "__main__":
    main()
