"""Reader memory over many batches: anonymous vs file-backed RSS, and page faults per batch.

Our PretrainTokenStreamDataset.get_batch and the nanoGPT recipe (a new np.memmap per batch) each draw
--batches B=32,T=1024 batches from the same synthetic cache (real layout, warm page cache), each in a
fresh subprocess. RssAnon and RssFile (/proc/self/status) are read before the first batch, after
the first 10% and at the end; page faults from resource.getrusage (minflt/majflt) per batch.
RssAnon must not grow; RssFile grows as the shards' pages are mapped (reclaimable page cache, shared
with every process reading the same cache; not a leak).

    .venv/bin/python bench/bench_cache_memory.py               # ~1 min on 2 cores
    .venv/bin/python bench/bench_cache_memory.py --batches 2000 --tokens 50e6
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from bench_cache_common import proc_status, table, write_synthetic_pretrain_cache

from niels_gpt.cache.pretrain_dataset import PretrainTokenStreamDataset

TOKENS = 400_000_000  # 800 MB of shards
BATCHES = 10_000
B, T = 32, 1024
READERS = ("ours get_batch", "nanoGPT recipe")


def child(reader: str, cache: Path, batches: int) -> dict:
    from bench_cache_readers import nanogpt_get_batch

    torch.set_num_threads(1)
    ds = PretrainTokenStreamDataset(str(cache / "train"), T=T, device="cpu")
    paths = [ds.shards_dir / n for n in ds.shard_names]
    g = torch.Generator().manual_seed(0)
    fn = (lambda: ds.get_batch(B=B, generator=g)) if reader == READERS[0] else \
        (lambda: nanogpt_get_batch(paths, B, T, g))
    fn()  # imports and first allocations
    marks = []

    def mark(n):
        ru = resource.getrusage(resource.RUSAGE_SELF)
        marks.append({"batches": n, **proc_status("RssAnon", "RssFile"), "minflt": ru.ru_minflt,
                      "majflt": ru.ru_majflt})

    mark(0)
    for i in range(1, batches + 1):
        fn()
        if i == batches // 10 or i == batches:
            mark(i)
    return {"reader": reader, "marks": marks}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--tokens", type=float, default=TOKENS, help="synthetic pretraining tokens")
    ap.add_argument("--batches", type=int, default=BATCHES)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--cache", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, Path(args.cache), args.batches)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        cache = write_synthetic_pretrain_cache(Path(tmp) / "c", int(args.tokens))
        for p in sorted((cache / "train").glob("*.bin")):
            p.read_bytes()  # warm page cache
        rows = []
        for reader in READERS:
            out = subprocess.run([sys.executable, __file__, "--child", reader, "--cache", str(cache),
                                  "--batches", str(args.batches)], check=True, capture_output=True, text=True)
            m = json.loads(out.stdout.strip().splitlines()[-1])["marks"]
            first, tenth, last = m
            n = last["batches"]
            rows.append([reader, n, first["RssAnon"] / 1024, tenth["RssAnon"] / 1024, last["RssAnon"] / 1024,
                         (last["RssAnon"] - first["RssAnon"]) / 1024, first["RssFile"] / 1024,
                         last["RssFile"] / 1024, (last["minflt"] - first["minflt"]) / n,
                         (last["majflt"] - first["majflt"]) / n])
        print(table(f"\nReader memory over {args.batches:,} batches B={B} T={T} from a "
                    f"{int(args.tokens) * 2 / 1e9:.1f} GB cache (MB; faults per batch)",
                    ["reader", "batches", "RssAnon 0", "RssAnon 10%", "RssAnon end", "RssAnon growth",
                     "RssFile 0", "RssFile end", "minflt/batch", "majflt/batch"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
