"""Does the loader keep the step fed? Fed %, MFU and the packed/causal step ratio, per loader kind and peer.

Fed % = the median step with a resident batch (one batch of the loader's shape kept on the device and served
again: no loader at all) / the median step with the loader; 100% = the loader costs the step nothing. On the GPU
each loader's run follows a resident run of its own; on CPU, where other jobs on a shared machine change the
step time by 2x within minutes, the two alternate step by step within one run. Beside it,
what the trainer itself measures: the data wait, host time inside next(data) (loader and host-to-device copy),
which on CUDA overlaps GPU work already queued, so it can say a lot where the GPU lost nothing. Medians over the
steps after the warm-up (compilation included on CUDA); tokens/s = tokens per step / median step.

1. CPU (always): a small GPT (2 layers, 128 wide) at T=128, B=8: every loader kind the trainer reads (random
   windows, indexed windows + global sampler, a mixture, the Parquet tokenizing loader running ahead, SFT rows,
   packed SFT bins) and two peers on the same model (nanoGPT's get_batch; a nanochat-style tokenizing loader,
   the re-implementation below); then the packed/causal step ratio at that shape (resident batches: the
   explicit document mask against the causal kernel).
2. GPU (--gpu, or wherever CUDA exists), bf16, torch.compile (the trainer's defaults):
   a. fed % at depth 4, T=1024, B=32 for every kind and peer (--gpu-depth/--gpu-T/--gpu-B change the shape);
   b. MFU at depth 20, T=2048, B=16 on a resident batch (the device's peak from niels_gpt/train/clock.py, or
      --peak-tflops);
   c. the packed/causal step ratio at depth 12, T=2048, B=32 (flex_attention's block mask against the flash
      causal kernel).

    .venv/bin/python bench/bench_train.py            # builds the demo caches first when absent; ~3-4 min on 2 cores
    .venv/bin/python bench/bench_train.py --gpu      # on a GPU machine: sections 1 and 2
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
from collections import deque
from pathlib import Path

import numpy as np
import torch

from niels_gpt.train.data import TrainData, to_model_batch
from niels_gpt.train.train import TrainConfig, train

CPU = dict(depth=2, sequence_len=128, device_batch_size=8)
GPU_FED = dict(depth=4, sequence_len=1024, device_batch_size=32)
GPU_MFU = dict(depth=20, sequence_len=2048, device_batch_size=16)
GPU_PACKED = dict(depth=12, sequence_len=2048, device_batch_size=32)
KINDS = ("windows", "indexed", "mixture", "parquet", "sft", "packed")


class Recipe:
    """A batch function behind the trainer's data interface (no resume: benchmarks only)."""

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


def resident(batch: dict, vocab: int, device) -> Recipe:
    """No loader: one batch, already on the device, served again every step."""
    on_device = to_model_batch(batch, torch.device(device))
    return Recipe("resident", lambda: on_device, vocab, device)


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
    """nanochat's tokenizing loader before best-fit: row groups -> encode with BOS -> token deque -> B*T+1
    windows, in the training loop (bench_loading.py --nanochat runs its current one)."""
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
    if not mix.is_file():
        mix.write_text(json.dumps({"seed": seed, "datasets": {n: str((root / "pretrain" / n).resolve()) for n in
                                                               ("wikitext", "gutenberg", "fineweb_edu")},
                                   "weights": {"wikitext": 0.5, "gutenberg": 0.3, "fineweb_edu": 0.2}}))
    packed = work / f"packed_{T}"
    if not (packed / "manifest.json").is_file():
        pack_sft(root / "sft" / "oasst1", packed, pack_size=T, on_overflow="truncate")
    pq_dir = work / "parquet"
    if not pq_dir.is_dir():
        import pyarrow as pa
        import pyarrow.parquet as pq

        from niels_gpt.sources.corpus import corpus
        from niels_gpt.sources.named import NAMED, inputs

        specs = [inputs(n, {}, seed=seed, sample=True) for n, named in NAMED.items() if named.kind == "pretrain"]
        texts = [t for s in specs for key in ("sources", "val_sources") if s.get(key)
                 for t in corpus(s[key], layout=s["layout"]).iter_texts()]
        paras = [p for t in texts for p in t.split("\n\n") if p.strip()]
        pq_dir.mkdir()
        for i in range(3):
            pq.write_table(pa.table({"text": paras[i::3]}), pq_dir / f"shard_{i:05d}.parquet", row_group_size=64)
    return {"windows": root / "pretrain" / "wikitext", "indexed": root / "pretrain" / "wikitext", "mixture": mix,
            "parquet": pq_dir, "sft": root / "sft" / "oasst1", "packed": packed}


def packed_batch(path: Path, B: int, T: int) -> dict:
    """B packed bins (cycled when there are fewer) collated as the trainer's packed loader collates them."""
    from niels_gpt.packing import collate_packed, open_packed

    ds = open_packed(path)
    return collate_packed([ds[i % len(ds)] for i in range(B)], pad_to=T)


RUN_IDS = itertools.count()


class Runs:
    """One train() per measurement, each in its own run directory, medians after the warm-up."""

    def __init__(self, work: Path, base: dict, warmup: int):
        self.work, self.base, self.warmup, self.count = work, base, warmup, RUN_IDS

    def __call__(self, data_path, data=None, alternate: dict | None = None, **kw) -> dict:
        cfg = TrainConfig(data=str(data_path), out_dir=str(self.work / f"run-{next(self.count)}"), **{**self.base, **kw})
        if alternate is not None:
            data = Alternating(data or TrainData(data_path, T=cfg.sequence_len, batch_size=cfg.device_batch_size,
                                                 seed=cfg.seed, device=cfg.device, sampling=cfg.sampling,
                                                 tokenizer=_tokenizer(cfg.tokenizer), prefetch=cfg.prefetch),
                               alternate)
        r = train(cfg, log=lambda *a: None, data=data)
        getattr(data, "close", lambda: None)()
        steps = range(self.warmup, len(r.dt))
        # NOTE: step s fetches the batch of step s+1 at its end (train.py): with Alternating, even steps take a
        # loader batch and odd steps the resident one
        loader = [s for s in steps if s % 2 == 0] if alternate is not None else list(steps)
        dt = statistics.median(r.dt[s] for s in loader)
        out = {"dt": dt, "wait_ms": 1e3 * statistics.median(r.wait[s] for s in loader),
               "tok_s": cfg.device_batch_size * cfg.sequence_len / dt,
               "mfu": statistics.median(r.mfu[s] for s in loader) if r.mfu else None}
        if alternate is not None:
            out["resident_dt"] = statistics.median(r.dt[s] for s in steps if s % 2 == 1)
        return out


def _tokenizer(path):
    from niels_gpt.tokenizer import load_tokenizer

    return load_tokenizer(path) if path else None


class Alternating:
    """A loader whose every other batch is a resident one: the steps with and without the loader interleaved
    within one run, so a machine's changing load weighs on both alike."""

    def __init__(self, data, batch: dict):
        self.data, self.calls = data, 0
        self.batch = to_model_batch(batch, torch.device(getattr(data, "device", "cpu")))

    def __getattr__(self, name):
        return getattr(self.data, name)

    def __next__(self):
        self.calls += 1
        return self.batch if self.calls % 2 else next(self.data)


def fed_table(root: Path, work: Path, device: str, shape: dict, steps: int, warmup: int, seed: int,
              peak: float | None, alternate: bool = False) -> list[dict]:
    """Fed % of every loader kind and peer against resident batches of the same shape: a resident run just
    before each loader's run, or (`alternate`) resident steps interleaved with the loader's in one run."""
    from niels_gpt.tokenizer import load_tokenizer

    paths = prepare(root, work, shape["sequence_len"], seed)  # first: builds the demo caches when absent
    tok = load_tokenizer(root / "tokenizer")
    T, B, vocab = shape["sequence_len"], shape["device_batch_size"], len(tok)
    runs = Runs(work, dict(steps=steps, seed=seed, device=device, log_every=0, eval_steps=1, peak_tflops=peak,
                           tokenizer=str(root / "tokenizer"), **shape), warmup)
    first = next(TrainData(paths["windows"], T=T, batch_size=B, seed=seed, device="cpu"))
    batches = {"causal": first, "packed": packed_batch(paths["packed"], B, T)}
    base = {"causal": [], "packed": []}
    rows = []
    shard = sorted((paths["windows"] / "train").glob("shard_*.bin"))[0]
    files = sorted(paths["parquet"].glob("*.parquet"))[:-1]
    contenders = [(f"ours: {k}", paths[k], None, {"sampling": "indexed"} if k == "indexed" else {}) for k in KINDS]
    contenders += [("peer: nanoGPT get_batch", paths["windows"],
                    Recipe("nanogpt", nanogpt_get_batch(shard, B, T, device), vocab, device), {}),
                   ("peer: nanochat-style tokenizing loader", paths["windows"],
                    Recipe("nanochat", nanochat_loader(files, tok, B, T, device), vocab, device), {})]
    for label, path, data, kw in contenders:
        # NOTE: each contender is paired with resident steps close in time: on a shared machine the load
        # changes by 2x within minutes, and a ratio of two runs minutes apart measures that instead
        kind = "packed" if label == "ours: packed" else "causal"
        if alternate:
            got = runs(path, data=data, alternate=batches[kind], **kw)
            ref = {"dt": got["resident_dt"], "tok_s": B * T / got["resident_dt"], "mfu": None}
        else:
            ref = runs(paths["windows"], data=resident(batches[kind], vocab, device))
            got = runs(path, data=data, **kw)
        base[kind].append(ref)
        rows.append({"label": label, "fed": 100 * ref["dt"] / got["dt"], **got})
    print(f"  {'loader':<40} {'fed %':>7} {'wait ms':>8} {'tok/s':>11} {'mfu %':>6}")
    for name, kind in (("resident batch (no loader)", "causal"), ("resident packed batch", "packed")):
        r = min(base[kind], key=lambda x: x["dt"])
        print(f"  {name + ' (best)':<40} {'100.0':>7} {'-':>8} {r['tok_s']:11,.0f} {_pct(r['mfu']):>6}")
    for r in rows:
        print(f"  {r['label']:<40} {r['fed']:7.1f} {r['wait_ms']:8.2f} {r['tok_s']:11,.0f} {_pct(r['mfu']):>6}",
              flush=True)
    return rows


def _pct(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def packed_vs_causal(root: Path, work: Path, device: str, shape: dict, steps: int, warmup: int, seed: int,
                     peak: float | None) -> float:
    """Median step of a resident packed batch / of a resident causal batch of the same shape."""
    from niels_gpt.tokenizer import load_tokenizer

    T, B = shape["sequence_len"], shape["device_batch_size"]
    paths = prepare(root, work, T, seed)  # first: builds the demo caches when absent
    vocab = len(load_tokenizer(root / "tokenizer"))
    runs = Runs(work, dict(steps=steps, seed=seed, device=device, log_every=0, eval_steps=1, peak_tflops=peak,
                           **shape), warmup)
    ids = torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))
    causal = runs(paths["windows"], data=resident({"input_ids": ids, "labels": ids}, vocab, device))
    packed = runs(paths["windows"], data=resident(packed_batch(paths["packed"], B, T), vocab, device))
    ratio = packed["dt"] / causal["dt"]
    print(f"  causal step {1e3 * causal['dt']:.1f} ms, packed step {1e3 * packed['dt']:.1f} ms: packed/causal "
          f"{ratio:.2f}x (MFU causal {_pct(causal['mfu'])}%)", flush=True)
    return ratio


def mfu_run(root: Path, work: Path, device: str, shape: dict, steps: int, warmup: int, seed: int,
            peak: float | None) -> float | None:
    from niels_gpt.tokenizer import load_tokenizer

    T, B = shape["sequence_len"], shape["device_batch_size"]
    vocab = len(load_tokenizer(root / "tokenizer"))
    runs = Runs(work, dict(steps=steps, seed=seed, device=device, log_every=0, eval_steps=1, peak_tflops=peak,
                           **shape), warmup)
    ids = torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))
    r = runs(root / "pretrain" / "wikitext", data=resident({"input_ids": ids, "labels": ids}, vocab, device))
    print(f"  step {1e3 * r['dt']:.0f} ms, {r['tok_s']:,.0f} tok/s, MFU {_pct(r['mfu'])}%", flush=True)
    return r["mfu"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache-dir", default="cache-demo", help="demo caches (built with --sample when absent)")
    p.add_argument("--steps", type=int, default=24, help="training steps per measurement (CPU)")
    p.add_argument("--gpu", action="store_true", help="insist on the GPU sections (default: when CUDA exists)")
    p.add_argument("--gpu-steps", type=int, default=40)
    p.add_argument("--gpu-warmup", type=int, default=10, help="GPU steps left out of the medians (compilation)")
    p.add_argument("--gpu-depth", type=int, default=GPU_FED["depth"])
    p.add_argument("--gpu-T", type=int, default=GPU_FED["sequence_len"], help="context of the fed % table")
    p.add_argument("--gpu-B", type=int, default=GPU_FED["device_batch_size"])
    p.add_argument("--peak-tflops", type=float, default=None, help="the device's peak (default: clock.py's table)")
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args(argv)
    root = Path(args.cache_dir)
    cuda = torch.cuda.is_available()
    if args.gpu and not cuda:
        print("--gpu: no CUDA device here", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        print(f"1. CPU, {CPU['depth']} layers, T={CPU['sequence_len']}, B={CPU['device_batch_size']}, {args.steps} "
              f"steps, medians after 3 ({torch.get_num_threads()} threads)")
        fed_table(root, work, "cpu", CPU, args.steps, 3, args.seed, args.peak_tflops, alternate=True)
        packed_vs_causal(root, work, "cpu", CPU, args.steps, 3, args.seed, args.peak_tflops)
        if not cuda:
            print("\n2. GPU: skipped, no CUDA device")
            return 0
        name = torch.cuda.get_device_name()
        fed = {**GPU_FED, "depth": args.gpu_depth, "sequence_len": args.gpu_T, "device_batch_size": args.gpu_B}
        gpu = (args.gpu_steps, args.gpu_warmup, args.seed, args.peak_tflops)
        print(f"\n2a. GPU {name}: fed %, depth {fed['depth']}, T={fed['sequence_len']}, B={fed['device_batch_size']}, "
              f"bf16, compiled, {args.gpu_steps} steps, medians after {args.gpu_warmup}")
        fed_table(root, work, "cuda", fed, *gpu)
        print(f"\n2b. GPU {name}: MFU, depth {GPU_MFU['depth']}, T={GPU_MFU['sequence_len']}, "
              f"B={GPU_MFU['device_batch_size']}, resident batch")
        mfu_run(root, work, "cuda", GPU_MFU, *gpu)
        print(f"\n2c. GPU {name}: packed/causal, depth {GPU_PACKED['depth']}, T={GPU_PACKED['sequence_len']}, "
              f"B={GPU_PACKED['device_batch_size']}")
        packed_vs_causal(root, work, "cuda", GPU_PACKED, *gpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
