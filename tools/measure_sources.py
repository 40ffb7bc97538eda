"""Read throughput of each layout of the input layer on the real corpora in ../shared/data (docs/sources.md).

    python tools/measure_sources.py [--data ../shared/data]

Each input is read twice in one process; the second pass is reported (the first, with its one-off imports, is
printed beside it).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from niels_gpt.sources.corpus import corpus

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def measure(name: str, make, size: int) -> None:
    first = None
    for _ in range(2):
        t = time.perf_counter()
        items = chars = 0
        for x in make():
            items += 1
            chars += len(x) if isinstance(x, str) else sum(len(m["content"]) for m in x)
        dt = time.perf_counter() - t
        first = dt if first is None else first
    print(f"{name:44s} {items:6d} items {chars:11,d} chars {dt:6.2f} s {size / dt / 1e6:7.1f} MB/s "
          f"(first pass {first:.2f} s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    d = ap.parse_args().data
    books = sorted((d / "gutenberg").glob("*.txt"))
    wiki = d / "wikitext" / "wikitext-2-raw.wiki.valid.raw"
    trees = d / "oasst1" / "oasst_pre_release.en_100_tree.jsonl"
    bulk = d / "bulk-text" / "debian-docs.jsonl"
    measure("gutenberg (10 books)", lambda: corpus(books, layout="gutenberg").iter_texts(),
            sum(p.stat().st_size for p in books))
    measure("wikitext (wikitext-2 valid)", lambda: corpus([wiki], layout="wikitext").iter_texts(), wiki.stat().st_size)
    measure("oasst1 (nested, 100 trees)", lambda: corpus([trees], layout="oasst", chat=True).iter_conversations(),
            trees.stat().st_size)
    measure("text (debian-docs.jsonl)", lambda: corpus([bulk]).iter_texts(), bulk.stat().st_size)

if __name__ == "__main__":
    main()
