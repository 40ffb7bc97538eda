"""Loading benchmarks, ours and the peers' recipes side by side in one run; prints ratios.

1. map-style loader: ResumableDataLoader + GlobalBatchSampler with 0, 1, 2 workers vs the bare
   dataset (index + collate in a loop) and vs torch's recipe (DataLoader + DistributedSampler);
2. streaming Parquet: ParquetTokenLoader (contiguous, bestfit) tokens/s vs the bare tokenizer
   (encode_batch) on the same text, and our best-fit packer vs nanochat's linear-scan loop;
3. best-fit utilisation and crop fraction at T=2048 (buffer 1000) on the real corpora.

    .venv/bin/python bench/bench_loading.py            # needs ../shared/data; ~2-3 min on 2 cores
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch
from bench_cache_common import timed
from torch.utils.data import DataLoader, DistributedSampler

from niels_gpt.cache.build_cache import build_pretrain_cache
from niels_gpt.loading import (
    GlobalBatchSampler,
    IndexedWindowDataset,
    ParquetTokenLoader,
    ResumableDataLoader,
)
from niels_gpt.loading.bestfit import BestFitPacker
from niels_gpt.tokenizer import TrainSettings, train_tokenizer

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
T, B = 1024, 16
BEST_FIT_T = 2048


def debian_docs(limit_chars: int) -> list[str]:
    out, n = [], 0
    with open(DATA / "bulk-text" / "debian-docs.jsonl", encoding="utf-8") as f:
        for line in f:
            text = json.loads(line)["text"]
            out.append(text)
            n += len(text)
            if n >= limit_chars:
                break
    return out


def wikitext_articles() -> list[str]:
    raw = (DATA / "wikitext" / "wikitext-2-raw.wiki.valid.raw").read_text(encoding="utf-8")
    arts, cur = [], []
    for line in raw.splitlines(keepends=True):
        if line.startswith(" = ") and not line.startswith(" = = ") and cur:
            arts.append("".join(cur))
            cur = []
        cur.append(line)
    return arts + ["".join(cur)]


def web_pages() -> list[str]:
    return [json.loads(line)["text"] for p in sorted((DATA / "web-cc-sample").glob("*.jsonl"))
            for line in p.read_text(encoding="utf-8").splitlines()]


def gutenberg_books() -> list[str]:
    return [p.read_text(encoding="utf-8-sig", errors="replace") for p in sorted((DATA / "gutenberg").glob("*.txt"))]


def bench_map_style(tok, docs, work: Path) -> list[tuple]:
    build_pretrain_cache(docs, str(work / "cache"), tokenizer=tok, max_train_tokens=4_000_000, max_val_tokens=10_000,
                         shard_bytes=1 << 22, seed=0, shuffle_buffer=None, num_workers=None)
    ds = IndexedWindowDataset(work / "cache", T)
    epochs = 6
    samples = len(ds) // B * B * epochs
    rows = []
    batches = list(GlobalBatchSampler(ds, B, seed=0, rank=0, world_size=1))

    def bare():
        from torch.utils.data import default_collate

        for _ in range(epochs):
            for idx in batches:
                default_collate([ds[i] for i in idx])

    base = timed(bare)
    rows.append(("bare dataset (index + collate)", samples / base, 1.0))
    for nw in (0, 1, 2):
        extra = {"persistent_workers": True, "prefetch_factor": 4} if nw else {}
        ours_loader = ResumableDataLoader(ds, GlobalBatchSampler(ds, B, seed=0, rank=0, world_size=1),
                                          num_workers=nw, **extra)
        peer_sampler = DistributedSampler(ds, num_replicas=1, rank=0, seed=0, drop_last=True)
        peer_loader = DataLoader(ds, batch_size=B, sampler=peer_sampler, num_workers=nw, drop_last=True, **extra)

        def run(loader):
            for _ in range(epochs):
                for _ in loader:
                    pass

        run(ours_loader), run(peer_loader)  # warm-up: worker start-up is not throughput
        t_ours, t_peer = timed(partial(run, ours_loader)), timed(partial(run, peer_loader))
        rows.append((f"ours ResumableDataLoader, {nw} workers", samples / t_ours, base / t_ours))
        rows.append((f"torch DataLoader+DistributedSampler, {nw} workers", samples / t_peer, base / t_peer))
    return rows


def nanochat_bestfit(docs_iter, rows: int, capacity: int, buffer_size: int) -> None:
    """nanochat's placement loop (linear scans over a Python list), for the packing-speed ratio."""
    buf = []
    for _ in range(rows):
        row = torch.empty(capacity, dtype=torch.long)
        pos = 0
        while pos < capacity:
            while len(buf) < buffer_size:
                buf.append(next(docs_iter))
            remaining = capacity - pos
            best, best_len = -1, 0
            for i, d in enumerate(buf):
                if best_len < len(d) <= remaining:
                    best, best_len = i, len(d)
            if best >= 0:
                d = buf.pop(best)
                row[pos:pos + len(d)] = torch.tensor(d, dtype=torch.long)
                pos += len(d)
            else:
                s = min(range(len(buf)), key=lambda i: len(buf[i]))
                d = buf.pop(s)
                row[pos:] = torch.tensor(d[:remaining], dtype=torch.long)
                pos = capacity


def bench_parquet(tok, docs, work: Path) -> list[tuple]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pdir = work / "parquet"
    pdir.mkdir()
    for i in range(4):
        pq.write_table(pa.table({"text": docs[i::4]}), pdir / f"shard_{i:05d}.parquet", row_group_size=64)
    files = sorted(pdir.glob("*.parquet"))
    total = sum(len(ids) + 1 for ids in tok.encode_batch(docs))
    bare = timed(lambda: tok.encode_batch(docs, num_threads=None), repeat=2)
    rows = [("bare tokenizer encode_batch", total / bare, 1.0)]
    stats = []
    for packing in ("contiguous", "bestfit"):
        n = total // (B * (T + 1)) - 1

        def run(packing=packing, n=n):
            loader = ParquetTokenLoader(files, tok, B, T, packing=packing, rank=0, world_size=1, buffer_size=200)
            for _ in range(n):
                next(loader)
            stats.append(loader.stats())

        t = timed(run, repeat=1)
        rows.append((f"ParquetTokenLoader {packing}: tokens out", n * B * T / t, (n * B * T / t) / (total / bare)))
        enc = stats[-1]["tokens_encoded"] / t
        rows.append((f"ParquetTokenLoader {packing}: tokens tokenized (crop {stats[-1]['crop_fraction']:.2f})",
                     enc, enc / (total / bare)))
    encoded = [np.asarray([tok.bos_id] + ids, dtype=np.int64) for ids in tok.encode_batch(docs)]
    rows_n = 400

    def ours():
        it = iter(enumerate(encoded * 50))
        packer = BestFitPacker(lambda: next(it), 1000)
        row = np.empty(BEST_FIT_T + 1, dtype=np.int64)
        for _ in range(rows_n):
            packer.fill_row(row)

    lists = [e.tolist() for e in encoded]
    t_peer = timed(lambda: nanochat_bestfit(iter(lists * 50), rows_n, BEST_FIT_T + 1, 1000), repeat=1)
    t_ours = timed(ours, repeat=1)
    rows.append(("nanochat best-fit loop (T=2048, buffer 1000), rows/s", rows_n / t_peer, 1.0))
    rows.append(("our best-fit packer (bisect), rows/s", rows_n / t_ours, t_peer / t_ours))
    return rows


def bench_bestfit_stats(tok) -> list[tuple]:
    out = []
    for name, docs in (("debian-docs", debian_docs(20_000_000)), ("wikitext-2 valid articles", wikitext_articles()),
                       ("web-cc sample pages", web_pages()), ("gutenberg books", gutenberg_books())):
        encoded = [np.asarray([tok.bos_id] + ids, dtype=np.int64) for ids in tok.encode_batch(docs)]
        it = iter(enumerate(encoded * 1000))  # the loader wraps epochs the same way
        packer = BestFitPacker(lambda it=it: next(it), 1000)
        n_tokens = sum(len(e) for e in encoded)
        row = np.empty(BEST_FIT_T + 1, dtype=np.int64)
        for _ in range(max(1, n_tokens // (BEST_FIT_T + 1))):
            packer.fill_row(row)
        s = packer.stats()
        out.append((name, len(docs), n_tokens, s["utilisation"], s["crop_fraction"]))
    return out


def main() -> int:
    if not DATA.is_dir():
        print(f"{DATA} is absent: the benchmark needs the real corpora", file=sys.stderr)
        return 1
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        docs = debian_docs(8_000_000)
        t0 = time.perf_counter()
        tok = train_tokenizer(docs[:400], work / "tok", settings=TrainSettings(vocab_size=8000))
        print(f"tokenizer: {len(tok)} ids trained in {time.perf_counter() - t0:.1f}s on {len(docs[:400])} docs")
        print(f"\n1. map-style loading, T={T}, B={B} (samples/s; ratio vs bare dataset)")
        for name, rate, ratio in bench_map_style(tok, docs, work):
            print(f"  {name:<48} {rate:>12,.0f}  x{ratio:.2f}")
        print(f"\n2. streaming Parquet, B={B}, T={T} (tokens/s; ratio vs bare tokenizer)")
        for name, rate, ratio in bench_parquet(tok, docs[:1500], work):
            print(f"  {name:<54} {rate:>12,.0f}  x{ratio:.2f}")
    print(f"\n3. best-fit packing at T={BEST_FIT_T}, buffer 1000 (nanochat reports ~35% cropped on fineweb-edu)")
    print(f"  {'corpus':<28} {'docs':>6} {'tokens':>11} {'utilisation':>12} {'crop fraction':>14}")
    for name, n_docs, n_tok, util, crop in bench_bestfit_stats(tok):
        print(f"  {name:<28} {n_docs:>6} {n_tok:>11,} {util:>12.3f} {crop:>14.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
