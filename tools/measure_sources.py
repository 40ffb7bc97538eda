"""Read throughput of each source on the real corpora in ../shared/data (the figures in docs/sources.md).

    python tools/measure_sources.py [--data ../shared/data]

Each source is read twice in one process; the second pass is reported, so the one-off cost of
importing `datasets` and resolving its builders (~1-4 s, printed separately) is not counted.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from niels_gpt.sources import fineweb_edu, gutenberg, oasst1, wikitext
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
    measure("gutenberg (10 books)", lambda: gutenberg(d / "gutenberg").iter_texts(),
            sum(p.stat().st_size for p in books))
    measure("wikitext (wikitext-2 valid, text builder)",
            lambda: wikitext(data_files={"validation": wiki}).iter_texts("val"), wiki.stat().st_size)
    measure("oasst1 (nested, 100 trees)", lambda: oasst1(trees_jsonl=trees).iter_conversations(),
            trees.stat().st_size)
    measure("corpus (debian-docs.jsonl)", lambda: corpus([bulk]).iter_texts(), bulk.stat().st_size)
    measure("fineweb_edu seed=None (debian-docs.jsonl)",
            lambda: fineweb_edu(data_files=bulk, seed=None).iter_texts(), bulk.stat().st_size)
    measure("fineweb_edu seed=42 buffer 10k (debian-docs.jsonl)",
            lambda: fineweb_edu(data_files=bulk).iter_texts(), bulk.stat().st_size)


if __name__ == "__main__":
    main()
