"""Does the loader make the training step wait? Loader stall % per loader kind, and the peers' recipes.

Stall % = time the step spent inside the loader (taking its next batch, host-to-device copy
included) / wall time of the step; the trainer measures it every step (niels_gpt/train/train.py).
Reported: medians over the steps after the first WARMUP of stall %, data wait per step (and its
ratio to nanoGPT's get_batch in the same run) and tokens/s (tokens per step / median step time).

- CPU (always): a small GPT (2 layers, 128 wide) at T=128, B=8, for every loader kind the trainer
  reads (random windows, indexed windows + global sampler, a mixture, the Parquet tokenizing loader,
  SFT rows, packed SFT bins), side by side with nanoGPT's get_batch and a nanochat-style loader
  (Parquet row groups tokenized into a token deque, B*T+1 windows) on the same model.
- GPU (where CUDA exists, or --gpu): a ~110M-parameter GPT (12 layers, 768 wide, bf16 autocast) at
  T=1024 (--gpu-T 2048 for the long context), B=16, the same loaders and peers, pinned memory and
  non_blocking copies.

    .venv/bin/python bench/bench_train.py            # builds the demo caches first when absent; ~2-3 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections import deque
from pathlib import Path

import numpy as np
import torch

from niels_gpt.train.data import to_model_batch
from niels_gpt.train.train import TrainConfig, train

WARMUP = 3
CPU = dict(depth=2, sequence_len=128, device_batch_size=8)
GPU = dict(depth=12, sequence_len=1024, device_batch_size=16)


class Recipe:
    """A peer's batch function behind the trainer's data interface (no resume: benchmarks only)."""

    has_val = False

    def __init__(self, kind: str, fn, vocab_size: int, device):
        self.kind, self.fn, self.vocab_size, self.device = kind, fn, vocab_size, torch.device(device)

    def __next__(self):
        return to_model_batch(self.fn(), self.device)

    def state_dict(self):
        return {"kind": self.kind, "loader": {}}

    def load_state_dict(self, state):
        raise NotImplementedError("benchmark recipes do not resume")

    def val_batches(self, steps):
        return []


def nanogpt_get_batch(bin_path: Path, B: int, T: int, device):
    """nanoGPT train.py: a fresh np.memmap per batch, one slice per row, torch.stack, pin + non_blocking."""
    g = torch.Generator().manual_seed(0)
    cuda = torch.device(device).type == "cuda"

    def get_batch():
        data = np.memmap(bin_path, dtype=np.uint16, mode="r")
        ix = torch.randint(len(data) - T, (B,), generator=g)
        x = torch.stack([torch.from_numpy(data[i:i + T].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + T].astype(np.int64)) for i in ix])
        if cuda:
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x, y

    return get_batch


def nanochat_loader(files: list[Path], tok, B: int, T: int, device):
    """nanochat's tokenizing loader: row groups -> encode with BOS -> token deque -> B*T+1 windows."""
    import pyarrow.parquet as pq

    cuda = torch.device(device).type == "cuda"

    def documents():
        while True:
            for f in files:
                pf = pq.ParquetFile(f)
                for rg in range(pf.num_row_groups):
                    texts = pf.read_row_group(rg, columns=["text"]).column(0).to_pylist()
                    for i in range(0, len(texts), 128):
                        yield from tok.encode_batch(texts[i:i + 128])

    docs, buf = documents(), deque()

    def get_batch():
        need = B * T + 1
        while len(buf) < need:
            buf.append(tok.bos_id)
            buf.extend(next(docs))
        tokens = [buf.popleft() for _ in range(need)]
        t = torch.tensor(tokens, dtype=torch.int64, pin_memory=cuda)
        x, y = t[:-1].view(B, T), t[1:].view(B, T)
        if cuda:
            return x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        return x, y

    return get_batch


def prepare(root: Path, work: Path, T: int, seed: int) -> dict:
    """Paths of every loader kind's data, from the demo caches (built when absent)."""
    from niels_gpt.cache.cli import main as cli
    from niels_gpt.packing import pack_sft

    if not (root / "pretrain" / "wikitext" / "meta.json").is_file():
        if cli(["build-all", "--cache-dir", str(root), "--seed", str(seed), "--sample", "--no-progress"]):
            raise SystemExit("build-all failed")
    mix = work / "mix.json"
    mix.write_text(json.dumps({"seed": seed, "datasets": {n: str((root / "pretrain" / n).resolve()) for n in
                                                           ("wikitext", "gutenberg", "fineweb_edu")},
                               "weights": {"wikitext": 0.5, "gutenberg": 0.3, "fineweb_edu": 0.2}}))
    packed = work / f"packed_{T}"
    if not (packed / "manifest.json").is_file():
        pack_sft(root / "sft" / "oasst1", packed, pack_size=T, on_overflow="truncate")
    import pyarrow as pa
    import pyarrow.parquet as pq

    from niels_gpt.sources import sample_sources

    texts = [t for src in sample_sources(seed=seed).values() if hasattr(src, "iter_texts")
             for split in (("train", "val") if src.own_split else (None,)) for t in src.iter_texts(split)]
    paras = [p for t in texts for p in t.split("\n\n") if p.strip()]
    pq_dir = work / "parquet"
    pq_dir.mkdir(exist_ok=True)
    for i in range(3):
        pq.write_table(pa.table({"text": paras[i::3]}), pq_dir / f"shard_{i:05d}.parquet", row_group_size=64)
    return {"windows": root / "pretrain" / "wikitext", "indexed": root / "pretrain" / "wikitext", "mixture": mix,
            "parquet": pq_dir, "sft": root / "sft" / "oasst1", "packed": packed}


def measure(label: str, cfg: TrainConfig, data=None) -> dict:
    r = train(cfg, log=lambda *a: None, data=data)
    tokens = cfg.device_batch_size * cfg.sequence_len
    return {"label": label, "stall": statistics.median(r.stall[WARMUP:]), "stall_max": max(r.stall[WARMUP:]),
            "wait_ms": 1e3 * statistics.median(r.wait[WARMUP:]), "tok_s": tokens / statistics.median(r.dt[WARMUP:])}


def run(root: Path, device: str, shape: dict, steps: int, seed: int) -> list[dict]:
    from niels_gpt.tokenizer import load_tokenizer

    tok = load_tokenizer(root / "tokenizer")
    T, B = shape["sequence_len"], shape["device_batch_size"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        paths = prepare(root, work, T, seed)
        base = dict(out_dir=str(work / "run"), steps=steps, seed=seed, device=device, log_every=0, eval_steps=1,
                    tokenizer=str(root / "tokenizer"), **shape)

        shard = sorted((paths["windows"] / "train").glob("shard_*.bin"))[0]
        vocab = len(tok)
        files = sorted(paths["parquet"].glob("*.parquet"))[:-1]
        contenders = [(f"ours: {kind}", TrainConfig(data=str(paths[kind]), **base,
                                                   **({"sampling": "indexed"} if kind == "indexed" else {})), None)
                      for kind in ("windows", "indexed", "mixture", "parquet", "sft", "packed")]
        contenders += [
            ("peer: nanoGPT get_batch", TrainConfig(data=str(paths["windows"]), **base),
             Recipe("nanogpt", nanogpt_get_batch(shard, B, T, device), vocab, device)),
            ("peer: nanochat-style tokenizing loader", TrainConfig(data=str(paths["windows"]), **base),
             Recipe("nanochat", nanochat_loader(files, tok, B, T, device), vocab, device))]
        for label, cfg, data in contenders:
            rows.append(measure(label, cfg, data))
        ref = next(r for r in rows if r["label"] == "peer: nanoGPT get_batch")["wait_ms"]
        print(f"  {'loader':<40} {'stall %':>8} {'(max)':>8} {'wait ms':>8} {'x nanoGPT':>9} {'tok/s':>10}")
        for r in rows:
            print(f"  {r['label']:<40} {r['stall']:8.2f} {r['stall_max']:8.2f} {r['wait_ms']:8.2f} "
                  f"{r['wait_ms'] / ref:9.2f} {r['tok_s']:10,.0f}", flush=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache-dir", default="cache-demo", help="demo caches (built with --sample when absent)")
    p.add_argument("--steps", type=int, default=20, help="training steps per loader (CPU)")
    p.add_argument("--gpu", action="store_true", help="insist on the GPU run (default: when CUDA exists)")
    p.add_argument("--gpu-steps", type=int, default=40)
    p.add_argument("--gpu-T", type=int, default=GPU["sequence_len"], help="context for the GPU run (1024-2048)")
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args(argv)
    root = Path(args.cache_dir)
    print(f"1. CPU, {CPU['depth']} layers, T={CPU['sequence_len']}, B={CPU['device_batch_size']}, "
          f"{args.steps} steps, median stall after {WARMUP} steps ({torch.get_num_threads()} threads)")
    run(root, "cpu", CPU, args.steps, args.seed)
    if torch.cuda.is_available():
        shape = {**GPU, "sequence_len": args.gpu_T}
        print(f"\n2. GPU {torch.cuda.get_device_name()}, {GPU['depth']} layers x 768 (~110M parameters), "
              f"T={args.gpu_T}, B={GPU['device_batch_size']}, bf16, {args.gpu_steps} steps")
        run(root, "cuda", shape, args.gpu_steps, args.seed)
    elif args.gpu:
        print("--gpu: no CUDA device here", file=sys.stderr)
        return 1
    else:
        print("\n2. GPU: skipped, no CUDA device")
    return 0


if __name__ == "__main__":
    sys.exit(main())
