"""Warm-cache batch readers, ours and the peers' recipes side by side in one run; prints ratios.

Pretraining, at B=32,T=1024 and B=8,T=4096 (both tunable), all on one synthetic cache (real layout,
shards of `--shard-mb`, fully in the page cache):
- ours: PretrainTokenStreamDataset.get_batch (one gather per shard touched, contiguous int64 x and y);
- nanoGPT's recipe: a new np.memmap per batch, one slice per row, `.astype(int64)`, torch.stack for
  x and for y (nanoGPT train.py `get_batch`), on one shard drawn per batch;
- KempnerForge-style: a map-style Dataset over the memmapped shards whose __getitem__ returns
  {"input_ids", "labels"} int64 tensors for one window, through DataLoader(batch_size=B, shuffle) with
  default collation (num_workers=0: the same single core as the others);
- the machine's limit: numpy `uint16 -> int64` conversion (`astype`, a fresh array each time, as every
  batch is) of B*(T+1) consecutive tokens, and of 2*B*T (what x and y together hold), read from a
  256 MiB array in RAM (so from DRAM, not from the CPU caches, like a batch).
SFT at B=16,T=1024 (tunable): SFTExampleDataset.get_batch vs a per-row Python recipe (slice, pad,
walk the ids to mark assistant spans, torch.stack), and vs the same conversion limit for B*(T+1).

    .venv/bin/python bench/bench_cache_readers.py              # ~1.5 min on 2 cores
    .venv/bin/python bench/bench_cache_readers.py --tokens 50e6 --batches 100   # quicker
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from bench_cache_common import (
    SPECIALS,
    best_rate,
    table,
    write_synthetic_pretrain_cache,
    write_synthetic_sft_cache,
)
from torch.utils.data import DataLoader, Dataset

from niels_gpt.cache.pretrain_dataset import PretrainTokenStreamDataset
from niels_gpt.cache.sft_dataset import SFTExampleDataset

TOKENS = 200_000_000  # 400 MB of uint16 in train: several shards, comfortably in RAM
SHARD_MB = 128
SHAPES = "32x1024,8x4096"
SFT_SHAPE = "16x1024"
SFT_EXAMPLES = 50_000
BATCHES = 1000
PAGE_TOKENS = 2048  # uint16 tokens per 4 KiB page


def nanogpt_get_batch(shard_paths: list[Path], B: int, T: int, g: torch.Generator):
    """nanoGPT train.py get_batch: re-open the memmap every batch, one slice per row, torch.stack."""
    path = shard_paths[int(torch.randint(len(shard_paths), (1,), generator=g))]
    data = np.memmap(path, dtype=np.uint16, mode="r")
    ix = torch.randint(len(data) - T, (B,), generator=g)
    x = torch.stack([torch.from_numpy(data[i:i + T].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + T].astype(np.int64)) for i in ix])
    return x, y


class KempnerStyleDataset(Dataset):
    """Map-style: sample i is window i (T+1 tokens) of the concatenated shards, one memmap per shard."""

    def __init__(self, shard_paths: list[Path], T: int):
        self.paths, self.T = shard_paths, T
        self.data = [np.memmap(p, dtype=np.uint16, mode="r") for p in shard_paths]
        counts = np.array([(len(d) - 1) // T for d in self.data])
        self.cum = np.concatenate([[0], np.cumsum(counts)])

    def __len__(self) -> int:
        return int(self.cum[-1])

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        k = int(np.searchsorted(self.cum, idx, side="right") - 1)
        s = (idx - int(self.cum[k])) * self.T
        tokens = torch.from_numpy(self.data[k][s:s + self.T + 1].astype(np.int64))
        return {"input_ids": tokens[:-1], "labels": tokens[1:]}


def python_sft_rows(tokens: np.ndarray, offsets: np.ndarray, ends: np.ndarray, B: int, T: int,
                    g: torch.Generator):
    """Per-row recipe: slice each example, pad with EOT, mark assistant spans walking the ids."""
    eot, asst = SPECIALS["eot"], SPECIALS["asst"]
    xs, ys, ms = [], [], []
    for i in torch.randint(len(offsets), (B,), generator=g).tolist():
        seq = tokens[offsets[i]:min(ends[i], offsets[i] + T + 1)].astype(np.int64).tolist()
        n = len(seq)
        seq = seq + [eot] * (T + 1 - n)
        inside, mask = False, []
        for t, tok in enumerate(seq[1:], start=1):
            prev = seq[t - 1]
            inside = True if prev == asst else (False if prev == eot else inside)
            mask.append(tok if inside and t < n else -100)
        xs.append(torch.tensor(seq[:-1]))
        ys.append(torch.tensor(seq[1:]))
        ms.append(torch.tensor(mask))
    return torch.stack(xs), torch.stack(ys), torch.stack(ms)


LIMIT_SOURCE_TOKENS = 128 << 20  # 256 MiB: the limit's source comes from DRAM, as a batch's does


def limit_rate(n_tokens: int, batches: int) -> float:
    """Batches/s of `astype(int64)` on n_tokens consecutive uint16 tokens, walking a 256 MiB array."""
    src = (np.arange(LIMIT_SOURCE_TOKENS) % 16000).astype(np.uint16)
    pos = 0

    def convert():
        nonlocal pos
        pos = pos + n_tokens if pos + 2 * n_tokens <= len(src) else 0
        return src[pos:pos + n_tokens].astype(np.int64)

    return best_rate(convert, n=batches)


def bench_pretrain(cache: Path, B: int, T: int, batches: int) -> list[list]:
    ds = PretrainTokenStreamDataset(str(cache / "train"), T=T, device="cpu")
    paths = [ds.shards_dir / n for n in ds.shard_names]
    g = torch.Generator().manual_seed(0)
    kds = KempnerStyleDataset(paths, T)
    # Steady state of a long run: every page of the readers that map the shards once is already
    # mapped (a first pass of random batches would take minutes to get there). The nanoGPT recipe
    # maps afresh every batch by design, and pays its page faults each time.
    ds.core.open()
    int(ds.core.flat[::PAGE_TOKENS, 0].sum())
    for d in kds.data:
        int(d[::PAGE_TOKENS].sum())
    ours = best_rate(lambda: ds.get_batch(B=B, generator=g), n=batches)
    nano = best_rate(lambda: nanogpt_get_batch(paths, B, T, g), n=max(batches // 4, 10))
    loader = DataLoader(kds, batch_size=B, shuffle=True, generator=g, num_workers=0)
    it = iter(loader)

    def kempner():
        nonlocal it
        try:
            return next(it)
        except StopIteration:
            it = iter(loader)
            return next(it)

    kemp = best_rate(kempner, n=max(batches // 4, 10))
    lim_w = limit_rate(B * (T + 1), batches)
    lim_xy = limit_rate(2 * B * T, batches)
    tok = B * T
    rows = [[f"B={B} T={T}", "ours get_batch", ours, ours * tok / 1e6, 1.0, ours / lim_w, ours / lim_xy],
            ["", "nanoGPT recipe", nano, nano * tok / 1e6, ours / nano, nano / lim_w, nano / lim_xy],
            ["", "KempnerForge-style DataLoader", kemp, kemp * tok / 1e6, ours / kemp, kemp / lim_w, kemp / lim_xy],
            ["", "limit: astype B*(T+1)", lim_w, lim_w * tok / 1e6, ours / lim_w, 1.0, lim_w / lim_xy],
            ["", "limit: astype 2*B*T", lim_xy, lim_xy * tok / 1e6, ours / lim_xy, lim_xy / lim_w, 1.0]]
    return rows


def bench_sft(cache: Path, B: int, T: int, batches: int) -> list[list]:
    ds = SFTExampleDataset(str(cache / "train_tokens.bin"), str(cache / "train_idx.npy"), T=T, device="cpu",
                           eot_id=SPECIALS["eot"])
    g = torch.Generator().manual_seed(0)
    ours = best_rate(lambda: ds.get_batch(B=B, generator=g), n=batches)
    tokens = np.memmap(cache / "train_tokens.bin", dtype=np.uint16, mode="r")
    py = best_rate(lambda: python_sft_rows(tokens, ds.offsets, ds.ends, B, T, g), n=max(batches // 20, 5))
    lim = limit_rate(B * (T + 1), batches)
    lim3 = limit_rate(3 * B * T, batches)
    tok = B * T
    return [[f"B={B} T={T}", "ours SFT get_batch", ours, ours * tok / 1e6, 1.0, ours / lim, ours / lim3],
            ["", "per-row Python recipe", py, py * tok / 1e6, ours / py, py / lim, py / lim3],
            ["", "limit: astype B*(T+1)", lim, lim * tok / 1e6, ours / lim, 1.0, lim / lim3],
            ["", "limit: astype 3*B*T", lim3, lim3 * tok / 1e6, ours / lim3, lim3 / lim, 1.0]]


def shapes(spec: str) -> list[tuple[int, int]]:
    return [tuple(int(v) for v in s.split("x")) for s in spec.split(",")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--tokens", type=float, default=TOKENS, help="synthetic pretraining tokens")
    ap.add_argument("--shard-mb", type=int, default=SHARD_MB, help="shard size of the synthetic cache")
    ap.add_argument("--shapes", default=SHAPES, help="pretraining BxT list")
    ap.add_argument("--sft-shape", default=SFT_SHAPE, help="SFT BxT")
    ap.add_argument("--sft-examples", type=int, default=SFT_EXAMPLES)
    ap.add_argument("--batches", type=int, default=BATCHES, help="batches per timing of our reader")
    ap.add_argument("--work", default=None, help="directory for the synthetic caches (default: a temp dir)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        work = Path(tmp)
        print(f"writing {int(args.tokens):,} synthetic tokens in {args.shard_mb} MB shards under {work} ...",
              flush=True)
        cache = write_synthetic_pretrain_cache(work / "pre", int(args.tokens), shard_bytes=args.shard_mb << 20)
        for p in sorted((cache / "train").glob("*.bin")):  # warm the page cache
            p.read_bytes()
        rows = []
        for B, T in shapes(args.shapes):
            rows += bench_pretrain(cache, B, T, args.batches)
        hdr = ["shape", "reader", "batches/s", "Mtok/s", "ours/this", "this/limit(B*(T+1))", "this/limit(2BT)"]
        print(table("\nPretraining get_batch, warm page cache (1 thread)", hdr, rows))
        sft = write_synthetic_sft_cache(work / "sft", args.sft_examples)
        B, T = shapes(args.sft_shape)[0]
        hdr = ["shape", "reader", "batches/s", "Mtok/s", "ours/this", "this/limit(B*(T+1))", "this/limit(3BT)"]
        print(table("\nSFT get_batch, warm page cache (1 thread)", hdr, bench_sft(sft, B, T, args.batches)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
