"""Packed-SFT benchmarks, ours and the peers' recipes side by side in one run; prints ratios.

1. packing efficiency (non-pad fraction) and time, pack_size 4096, for ffd / bfd / first_fit_shuffle:
   - the real SFT length distribution: dolly and oasst SFT caches built with build_sft_cache and a
     sentencepiece tokenizer trained here (8k pieces) on the real corpora in ../shared/data;
   - 1M lengths resampled (torch.multinomial) from that real distribution, and 1M synthetic
     log-normal lengths (median ~245 tokens, clipped to 1..4096);
   peers: Megatron-Bridge's recursive segment-tree first_fit (ffd and shuffle; O(n log n) in Python
   recursion) and NeMo's classic first_fit (scans every bin, `sum(bin)` each time: O(n * bins)), run
   on a PEER_N subsample with ours timed on the same subsample for the ratio;
2. reader throughput: packed bins (PackedMemmapDataset + collate_packed, batch of 4 bins) vs the SFT
   row dataset (SFTExampleDataset.get_batch, T = 4096 and T = 1024) on the same cache: non-pad tokens
   per second and non-pad fraction of each batch.

    .venv/bin/python bench/bench_packing.py          # needs ../shared/data; about 2 minutes on 2 cores
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from niels_gpt.cache.build_cache import build_sft_cache
from niels_gpt.cache.sft_dataset import SFTExampleDataset
from niels_gpt.packing import ALGORITHMS, PackedMemmapDataset, collate_packed, pack_lengths, pack_sft
from niels_gpt.packing.source import open_sft_split
from niels_gpt.tokenizer import TrainSettings, train_tokenizer

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
PACK = 4096
N_BIG = 1_000_000
PEER_N = 100_000
CLASSIC_N = 10_000
READ_BATCHES = 200
REPEAT_CONVERSATIONS = 20  # the real sample is small: repeat it for a cache worth timing


# ---- peers' recipes (Megatron-Bridge data/packing/algorithms.py; NeMo utils/sequence_packing_utils.py)

class _SegmentTree:  # Megatron-Bridge: recursive max tree over bin capacities
    def __init__(self, n):
        self.n, self.t = n, [0] * (4 * n)

    def _update(self, node, lo, hi, idx, val):
        if lo == hi:
            self.t[node] = val
            return
        mid = (lo + hi) // 2
        if idx <= mid:
            self._update(2 * node, lo, mid, idx, val)
        else:
            self._update(2 * node + 1, mid + 1, hi, idx, val)
        self.t[node] = max(self.t[2 * node], self.t[2 * node + 1])

    def _query(self, node, lo, hi, need):
        if self.t[node] < need:
            return -1
        if lo == hi:
            return lo
        mid = (lo + hi) // 2
        left = self._query(2 * node, lo, mid, need)
        return left if left != -1 else self._query(2 * node + 1, mid + 1, hi, need)


def mb_first_fit(seqlens, pack_size):
    tree, res, rem = _SegmentTree(len(seqlens)), [], []
    for s in seqlens:
        b = tree._query(1, 0, tree.n - 1, s)
        if b == -1 or b >= len(res):
            res.append([s])
            rem.append(pack_size - s)
            b = len(res) - 1
        else:
            res[b].append(s)
            rem[b] -= s
        tree._update(1, 0, tree.n - 1, b, rem[b])
    return res


def nemo_first_fit(seqlens, pack_size):
    res = []
    for s in seqlens:
        for abin in res:
            if sum(abin) + s <= pack_size:
                abin.append(s)
                break
        else:
            res.append([s])
    return res


def peer(name, lengths):
    lens = lengths.tolist()
    if name == "mb_ffd":
        return mb_first_fit(sorted(lens, reverse=True), PACK)
    if name == "mb_shuffle":
        perm = torch.randperm(len(lens), generator=torch.Generator().manual_seed(0)).tolist()
        return mb_first_fit([lens[i] for i in perm], PACK)
    if name == "nemo_ffd":
        return nemo_first_fit(sorted(lens, reverse=True), PACK)
    raise ValueError(name)


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


# ---- data

def corpus_texts(limit_chars: int = 6_000_000) -> list[str]:
    texts, n = [], 0
    for p in sorted((DATA / "gutenberg").glob("*.txt")) + [DATA / "wikitext" / "wikitext-2-raw.wiki.valid.raw"]:
        t = p.read_text(encoding="utf-8-sig", errors="replace")
        texts.append(t)
        n += len(t)
        if n >= limit_chars:
            break
    return texts


def real_caches(work: Path, tok) -> dict[str, Path]:
    from niels_gpt.sources.corpus import corpus

    convs = {name: list(corpus(sorted((DATA / folder).glob("*.jsonl")), layout=layout, chat=True).iter_conversations())
             for name, folder, layout in (("dolly", "dolly-15k", "dolly"), ("oasst", "oasst1", "oasst"))}
    out = {}
    for name, cs in convs.items():
        build_sft_cache(cs, str(work / name), tokenizer=tok, val_frac=0.0, seed=0, dataset_name=name)
        out[name] = work / name
    build_sft_cache([c for cs in convs.values() for c in cs] * REPEAT_CONVERSATIONS, str(work / "both_x20"),
                    tokenizer=tok, val_frac=0.0, seed=0, dataset_name="dolly+oasst x20")
    out["both_x20"] = work / "both_x20"
    return out


def row(cells, widths=(40, 10, 10, 10, 12)):
    return "  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=False))


def bench_packing(dists: dict[str, np.ndarray]) -> None:
    print("\n1. packing at pack_size 4096 (efficiency = non-pad fraction)")
    print(row(["distribution / algorithm", "n", "bins", "effic.", "seconds"]))
    for name, lengths in dists.items():
        for alg in ALGORITHMS:
            a, dt = timed(lambda alg=alg, lengths=lengths: pack_lengths(lengths, PACK, alg))
            print(row([f"{name} / ours {alg}", len(lengths), a.num_bins, f"{a.efficiency():.4f}", f"{dt:.3f}"]))
    print(f"\n   peers on the first {PEER_N:,} (classic NeMo: {CLASSIC_N:,}) lengths; ratio = peer time / ours")
    print(row(["distribution / recipe", "n", "bins", "effic.", "seconds", "ratio"], (40, 10, 10, 10, 12, 8)))
    for name, lengths in dists.items():
        if len(lengths) < PEER_N:
            continue  # NOTE: on a few hundred lengths every recipe takes microseconds: no signal
        for recipe, ours_alg, n in (("mb_ffd", "ffd", PEER_N), ("mb_shuffle", "first_fit_shuffle", PEER_N),
                                    ("nemo_ffd", "ffd", CLASSIC_N)):
            sub = lengths[:n]
            bins, dt_peer = timed(lambda recipe=recipe, sub=sub: peer(recipe, sub))
            ours, dt_ours = timed(lambda ours_alg=ours_alg, sub=sub: pack_lengths(sub, PACK, ours_alg))
            eff = sub.sum() / (len(bins) * PACK)
            print(row([f"{name} / {recipe}", len(sub), len(bins), f"{eff:.4f}", f"{dt_peer:.3f}",
                       f"{dt_peer / dt_ours:.1f}x"], (40, 10, 10, 10, 12, 8)))
            print(row([f"{name} / ours {ours_alg}", len(sub), ours.num_bins, f"{ours.efficiency():.4f}",
                       f"{dt_ours:.3f}", "1.0x"], (40, 10, 10, 10, 12, 8)))


def bench_reader(cache: Path, work: Path, tok) -> None:
    print(f"\n2. reader throughput on {cache.name} (non-pad tokens per second, batch of ~{4 * PACK} slots)")
    m, dt_pack = timed(lambda: pack_sft(cache, work / "packed", pack_size=PACK, algorithm="bfd"))
    print(f"   pack-sft: {m['num_bins']} bins, {m['num_sequences']} sequences, efficiency {m['efficiency']:.4f}, "
          f"{dt_pack:.2f} s ({m['num_tokens'] / dt_pack / 1e6:.2f} M tokens/s end to end)")
    ds = PackedMemmapDataset(work / "packed")
    g = torch.Generator().manual_seed(0)
    order = torch.randint(len(ds), (READ_BATCHES, 4), generator=g).tolist()
    t0, slots = time.perf_counter(), 0
    for idx in order:
        batch = collate_packed([ds[i] for i in idx], pad_to=PACK)
        slots += batch["input_ids"].numel()
    dt = time.perf_counter() - t0
    plen = np.load(work / "packed" / "packed_len.npy").astype(np.int64)
    nonpad = int(sum(plen[i].sum() for i in np.asarray(order)))
    packed_rate = nonpad / dt
    print(row(["reader", "nonpad", "slots", "nonpad%", "Mtok/s", "ratio"], (40, 10, 10, 10, 12, 8)))
    print(row(["packed bins (collate_packed)", nonpad, slots, f"{nonpad / slots:.3f}",
               f"{packed_rate / 1e6:.2f}", "1.0x"], (40, 10, 10, 10, 12, 8)))
    split = open_sft_split(cache, "train")
    for T, B in ((PACK, 4), (1024, 16)):
        rows = SFTExampleDataset(str(cache / "train_tokens.bin"), str(cache / "train_idx.npy"), T=T, device="cpu",
                                 eot_id=tok.eot_id)
        g = torch.Generator().manual_seed(0)
        t0, nonpad_rows = time.perf_counter(), 0
        for _ in range(READ_BATCHES):
            idx = torch.randint(len(rows), (B,), generator=g).numpy()
            rows.collate(idx)
            nonpad_rows += int(np.minimum(split.lengths[idx], T + 1).sum())
        dt = time.perf_counter() - t0
        rate = nonpad_rows / dt
        print(row([f"SFT rows T={T} B={B}", nonpad_rows, READ_BATCHES * B * (T + 1),
                   f"{nonpad_rows / (READ_BATCHES * B * (T + 1)):.3f}", f"{rate / 1e6:.2f}",
                   f"{rate / packed_rate:.2f}x"], (40, 10, 10, 10, 12, 8)))


def main() -> int:
    if not DATA.is_dir():
        print(f"{DATA} is absent: this benchmark needs the real corpora", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="bench_packing_") as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        tok = train_tokenizer(corpus_texts(), work / "tok", settings=TrainSettings(vocab_size=8000))
        caches = real_caches(work, tok)
        print(f"setup: tokenizer ({len(tok)} ids) and SFT caches built in {time.perf_counter() - t0:.1f} s")
        real = {name: open_sft_split(caches[name], "train").lengths for name in ("dolly", "oasst")}
        for name, lens in real.items():
            print(f"   {name}: {len(lens)} examples, mean {lens.mean():.0f} tokens, max {lens.max()}")
        both = np.concatenate(list(real.values()))
        g = torch.Generator().manual_seed(0)
        resampled = both[torch.randint(len(both), (N_BIG,), generator=g).numpy()]
        lognormal = torch.exp(5.5 + torch.randn(N_BIG, generator=g)).clamp(1, PACK).long().numpy()
        bench_packing({"dolly (real)": real["dolly"], "oasst (real)": real["oasst"],
                       "real resampled 1M": np.minimum(resampled, PACK), "log-normal 1M": lognormal})
        bench_reader(caches["both_x20"], work, tok)
    return 0


if __name__ == "__main__":
    sys.exit(main())
