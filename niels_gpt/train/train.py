"""The base training loop (nanochat's base_train, small): one step = grad accumulation to a token batch.

    step s:  for each micro-batch: forward (bf16 autocast on CUDA) -> loss / accum -> backward ->
             fetch the next micro-batch (it overlaps the GPU's backward) ; clip ; set LR and Muon
             momentum from the schedule ; step AdamW and Muon ; zero grads
    log:     loss, lr multiplier, tokens/s, data wait (time inside the loader + copy) and its share
             of the step ("stall %"); CUDA steps end with a synchronize, so the share is honest
    eval:    val bits per byte (evaluate_bpb, all-reduced) every eval_every steps and at the end;
             CORE on the bundled items (or a CORE bundle) at the end when asked
    ckpt:    model, optimizers, step, RNG, every rank's loader state; resuming gives the same
             losses bit for bit on CPU (tests/train/test_resume.py)

DDP: started by torchrun (WORLD_SIZE > 1): gloo on CPU, nccl on CUDA; every rank reads its own
share of each global batch through the loaders' rank arguments.
"""

from __future__ import annotations

import contextlib
import os
import pickle  # NOTE: only for its exception type; checkpoints load with weights_only=True
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from niels_gpt.atomic import atomic_path
from niels_gpt.errors import ConfigError, StateError
from niels_gpt.loading import evaluate_bpb
from niels_gpt.loading import token_bytes as tokenizer_bytes
from niels_gpt.seeds import check_seed
from niels_gpt.storage.remote import open_location, tokenizer_near
from niels_gpt.storage.settings import apply_cache_args
from niels_gpt.tokenizer import check_tokenizer_matches, load_tokenizer
from niels_gpt.train.data import TrainData
from niels_gpt.train.eval_core import run_core
from niels_gpt.train.model import GPT, GPTConfig
from niels_gpt.train.optim import Muon, build_optimizers, lr_multiplier, muon_momentum
from niels_gpt.urls import is_url, refuse_url

CHECKPOINT_VERSION = 1


@dataclass(kw_only=True)
class TrainConfig:
    data: str
    out_dir: str = "runs/base"
    data_kind: str = "auto"
    sampling: str = "random"
    shards_at_once: int = 8  # sampling="shards": shards read at a time (niels_gpt/loading/shard_windows.py)
    local_cache: str | None = None  # DATA at a URL: the download cache (default $NIELS_GPT_CACHE)
    cache_limit: str | None = None  # and its bound, e.g. 20GB (default $NIELS_GPT_CACHE_MAX_BYTES)
    packing: str = "bestfit"
    tokenizer: str | None = None
    # model (nanochat sizing from depth unless given)
    depth: int = 4
    n_embd: int | None = None
    n_head: int | None = None
    n_kv_head: int | None = None
    sequence_len: int = 256
    vocab_size: int | None = None
    # batch
    device_batch_size: int = 8
    total_batch_size: int | None = None  # tokens per optimizer step; default one micro-batch per rank
    steps: int = 100
    # optimizer
    optimizer: str = "muon"
    embedding_lr: float = 0.2
    unembedding_lr: float = 0.004
    matrix_lr: float = 0.02
    adamw_matrix_lr: float = 0.003
    weight_decay: float = 0.0
    warmup_ratio: float = 0.0
    warmdown_ratio: float = 0.2
    final_lr_frac: float = 0.0
    grad_clip: float = 1.0
    # runtime
    seed: int = 0
    device: str = "auto"
    num_workers: int = 0
    compile: bool = False
    eval_every: int = 0
    eval_steps: int = 8
    core: str | None = None  # "bundled", a CORE bundle directory, or a URL of its zip
    core_max_items: int | None = None
    save_every: int = 0
    stop_at: int | None = None  # leave the loop after this step (checkpointing it): a planned interruption
    resume: str | None = None  # "latest" or a checkpoint path
    log_every: int = 1


@dataclass
class TrainResult:
    losses: list[float] = field(default_factory=list)
    val_bpb: list[tuple[int, float]] = field(default_factory=list)
    core: dict | None = None
    checkpoint: str | None = None
    step: int = 0
    stall: list[float] = field(default_factory=list)  # per step: % of the step spent waiting for data
    wait: list[float] = field(default_factory=list)  # per step: seconds spent waiting for data
    dt: list[float] = field(default_factory=list)  # per step: wall seconds
    model: torch.nn.Module | None = None
    rows: list[list[list[int]]] = field(default_factory=list)  # input rows per micro-batch (record_rows=True)


def setup_distributed(device: str) -> tuple[int, int, torch.device]:
    """(rank, world_size, device); initialises the process group under torchrun."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if world > 1 and not dist.is_initialized():
        if dev.type == "cuda":
            dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
            torch.cuda.set_device(dev)
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    return rank, (dist.get_world_size() if dist.is_initialized() else 1), dev


def find_tokenizer(data_path: str | os.PathLike):
    """The tokenizer a cache was built with: a `tokenizer/` directory up to three levels above it."""
    if is_url(data_path):  # mirrored from beside the URL (niels_gpt/storage), once the cache there answers
        open_location(str(data_path))
        near = tokenizer_near(str(data_path))
        return load_tokenizer(near) if near is not None else None
    p = Path(data_path).resolve()
    for parent in [p, *p.parents][:4]:
        cand = parent / "tokenizer"
        if (cand / "spm.model").is_file() or (cand / "tokenizer.json").is_file():
            return load_tokenizer(cand)
    return None


def _recorded_tokenizer_sha(where: Path) -> str | None:
    import json

    meta = Path(where) / "meta.json"
    if not meta.is_file():
        return None
    sha = json.loads(meta.read_text("utf-8")).get("tokenizer_sha256")
    return sha if sha and set(sha) != {"0"} else None


def _require_recorded_tokenizer(tok, data_path) -> None:
    """An explicit --tokenizer must be the one the data records: bits per byte is scored with its byte lengths."""
    for path in str(data_path).split(","):
        where = open_location(path.strip())[0]  # a URL: its mirror, where meta.json is
        if where.is_dir():
            check_tokenizer_matches(tok, _recorded_tokenizer_sha(where), where)


def model_config(cfg: TrainConfig, vocab_size: int) -> GPTConfig:
    base = GPTConfig.from_depth(cfg.depth, vocab_size=vocab_size, sequence_len=cfg.sequence_len)
    if cfg.n_embd is not None or cfg.n_head is not None:
        n_embd = cfg.n_embd or base.n_embd
        n_head = cfg.n_head or base.n_head
        base = GPTConfig(sequence_len=cfg.sequence_len, vocab_size=vocab_size, n_layer=cfg.depth, n_head=n_head,
                         n_kv_head=n_head, n_embd=n_embd)
    if cfg.n_kv_head is not None:
        base = GPTConfig(**{**base.to_dict(), "n_kv_head": cfg.n_kv_head})
    return base


def latest_checkpoint(out_dir: str | os.PathLike) -> Path | None:
    found = sorted(Path(out_dir).glob("ckpt_*.pt"))
    return found[-1] if found else None


def save_checkpoint(path: Path, *, model, optimizers, step: int, loader_states: list, cfg: TrainConfig,
                    model_cfg: GPTConfig) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    ckpt = {"version": CHECKPOINT_VERSION, "step": step, "model": model.state_dict(),
            "optimizers": [o.state_dict() for o in optimizers], "loader": loader_states,
            "rng": {"cpu": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
            "model_config": model_cfg.to_dict(), "train_config": asdict(cfg)}
    with atomic_path(path) as tmp:
        torch.save(ckpt, tmp)


def load_checkpoint(path: str | os.PathLike) -> dict:
    p = Path(path)
    try:
        ckpt = torch.load(p, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as exc:
        raise StateError(f"{p}: not a readable checkpoint ({exc}); pick another with --resume PATH") from exc
    if not isinstance(ckpt, dict) or ckpt.get("version") != CHECKPOINT_VERSION:
        raise StateError(f"{p}: not a checkpoint of version {CHECKPOINT_VERSION} written by this trainer")
    return ckpt


def _resolve_resume(cfg: TrainConfig) -> Path | None:
    if cfg.resume is None:
        return None
    if cfg.resume == "latest":
        found = latest_checkpoint(cfg.out_dir)
        if found is None:
            raise StateError(f"--resume latest: no ckpt_*.pt in {cfg.out_dir}; start without --resume")
        return found
    return Path(cfg.resume)


def train(cfg: TrainConfig, *, token_bytes: torch.Tensor | None = None, log=print,
          record_rows: bool = False, data=None) -> TrainResult:
    """Run (or resume) a training run; returns the per-step losses, val bpb and CORE results.

    `token_bytes` replaces the tokenizer's byte lengths for bpb; `record_rows` keeps every input row
    in the result (tests compare what ranks and resumed runs saw). `data` replaces the loader chosen
    from cfg.data by any object with __next__ (model batches), state_dict, load_state_dict, kind,
    vocab_size, has_val and val_batches (bench/bench_train.py runs the peers' recipes through it).
    """
    refuse_url(cfg.out_dir, "--out-dir")
    if data is None and is_url(cfg.data):  # read through the download cache (docs/storage.md)
        apply_cache_args(cfg.local_cache, cfg.cache_limit)
    rank, world, device = setup_distributed(cfg.device)
    master = rank == 0
    say = log if master else (lambda *a, **k: None)
    check_seed(cfg.seed)
    if cfg.steps < 1:
        raise ConfigError(f"steps {cfg.steps}: must be >= 1")
    tok = None
    if cfg.tokenizer:
        tok = load_tokenizer(cfg.tokenizer)
        _require_recorded_tokenizer(tok, cfg.data)
    elif token_bytes is None:
        tok = find_tokenizer(cfg.data)
    if data is None:
        data = TrainData(cfg.data, T=cfg.sequence_len, batch_size=cfg.device_batch_size, seed=cfg.seed,
                         device=device, rank=rank, world_size=world, kind=cfg.data_kind, sampling=cfg.sampling,
                         num_workers=cfg.num_workers, tokenizer=tok, packing=cfg.packing, vocab_size=cfg.vocab_size,
                         shards_at_once=cfg.shards_at_once)
    if tok is None and token_bytes is None:
        tok = next(filter(None, (find_tokenizer(p) for p in getattr(data, "origins", ())[1:])), None)
    if tok is not None and not cfg.tokenizer:
        # a tokenizer found by looking around must be the one the cache records, or bpb would be wrong
        recorded = _recorded_tokenizer_sha(getattr(data, "origins", [Path(cfg.data)])[-1])
        if recorded and recorded != tok.sha256:
            say(f"{tok.model_path}: not the tokenizer {cfg.data} was built with (sha256 {recorded[:12]}...); "
                "ignored: pass --tokenizer")
            tok = None
    if token_bytes is None and tok is not None:
        token_bytes = tokenizer_bytes(tok)
    tokens_per_micro = cfg.device_batch_size * cfg.sequence_len * world
    total = cfg.total_batch_size or tokens_per_micro
    if total % tokens_per_micro:
        raise ConfigError(f"total_batch_size {total} is not a multiple of device_batch_size x sequence_len x "
                          f"world_size = {tokens_per_micro}: pick a multiple")
    accum = total // tokens_per_micro

    mcfg = model_config(cfg, data.vocab_size)
    torch.manual_seed(cfg.seed)
    model = GPT(mcfg).to(device)
    model.init_weights(torch.Generator(device=device).manual_seed(cfg.seed))
    optimizers = build_optimizers(model, optimizer=cfg.optimizer, embedding_lr=cfg.embedding_lr,
                                  unembedding_lr=cfg.unembedding_lr, matrix_lr=cfg.matrix_lr,
                                  adamw_matrix_lr=cfg.adamw_matrix_lr, weight_decay=cfg.weight_decay)
    start = 0
    resume_from = _resolve_resume(cfg)
    if resume_from is not None:
        ckpt = load_checkpoint(resume_from)
        if ckpt["model_config"] != mcfg.to_dict():
            raise StateError(f"{resume_from}: model {ckpt['model_config']} differs from this run's {mcfg.to_dict()}: "
                             "resume with the same model flags")
        model.load_state_dict(ckpt["model"])
        for opt, state in zip(optimizers, ckpt["optimizers"], strict=True):
            opt.load_state_dict(state)
        states = ckpt["loader"]
        data.load_state_dict(states[rank] if len(states) == world else states[0])
        torch.set_rng_state(ckpt["rng"]["cpu"])
        if device.type == "cuda" and ckpt["rng"]["cuda"]:
            torch.cuda.set_rng_state_all(ckpt["rng"]["cuda"])
        start = int(ckpt["step"])
        say(f"resumed from {resume_from} at step {start}")

    train_model = model
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        train_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    if cfg.compile:
        train_model = torch.compile(train_model)
    cuda = device.type == "cuda"
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if cuda else contextlib.nullcontext
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    say(f"data: {data.kind} from {cfg.data} | model: {mcfg.n_layer} layers, {mcfg.n_embd} wide, {mcfg.n_head} heads "
        f"({mcfg.n_kv_head} kv), {model.num_params():,} parameters | batch {total:,} tokens = {accum} x "
        f"{cfg.device_batch_size} x {cfg.sequence_len} x {world} rank(s) | {cfg.optimizer} | device {device}")

    if token_bytes is None:
        say("no tokenizer found above the data and none given (--tokenizer): val bpb is skipped")
    elif not data.has_val:
        say(f"{cfg.data}: no val split in this data: val bpb is skipped")
    result = TrainResult(step=start)

    def bpb(step: int) -> None:
        if token_bytes is None or not data.has_val:
            return
        model.eval()
        with autocast():
            value = evaluate_bpb(model, data.val_batches(cfg.eval_steps), token_bytes.to(device))
        model.train()
        result.val_bpb.append((step, value))
        say(f"step {step:05d} | val bpb {value:.4f}")

    def checkpoint(step: int) -> None:
        states = [loader_state]
        if world > 1:
            states = [None] * world
            dist.all_gather_object(states, loader_state)
        if master:
            path = Path(cfg.out_dir) / f"ckpt_{step:06d}.pt"
            save_checkpoint(path, model=model, optimizers=optimizers, step=step, loader_states=states, cfg=cfg,
                            model_cfg=mcfg)
            result.checkpoint = str(path)
            say(f"step {step:05d} | checkpoint {path}")

    last = cfg.steps if cfg.stop_at is None else min(cfg.steps, cfg.stop_at)
    t_wait = time.perf_counter()
    batch = next(data)
    wait = time.perf_counter() - t_wait
    loader_state = data.state_dict()
    for step in range(start, last):
        sync()
        t0 = time.perf_counter()
        step_wait, wait = wait, 0.0
        loss_sum = torch.zeros((), device=device)
        for micro in range(accum):
            if record_rows:
                result.rows.append(batch["input_ids"].tolist())
            sync_ctx = train_model.no_sync if (world > 1 and micro < accum - 1) else contextlib.nullcontext
            with sync_ctx():
                with autocast():
                    loss = train_model(batch["input_ids"], batch["labels"], position_ids=batch.get("position_ids"),
                                       cu_seqlens=batch.get("cu_seqlens"), doc_ids=batch.get("doc_ids"))
                loss_sum += loss.detach()
                (loss / accum).backward()
            done = step + 1 == last and micro == accum - 1
            if micro == accum - 1:
                loader_state = data.state_dict()  # the position after this step's last batch
            if not done:
                t_wait = time.perf_counter()
                batch = next(data)  # NOTE: on CUDA this overlaps the backward still running on the GPU
                step_wait += time.perf_counter() - t_wait
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        lrm = lr_multiplier(step, cfg.steps, warmup_ratio=cfg.warmup_ratio, warmdown_ratio=cfg.warmdown_ratio,
                            final_lr_frac=cfg.final_lr_frac)
        for opt in optimizers:
            for group in opt.param_groups:
                group["lr"] = group["initial_lr"] * lrm
            if isinstance(opt, Muon):
                for group in opt.param_groups:
                    group["momentum"] = muon_momentum(step)
            opt.step()
        model.zero_grad(set_to_none=True)
        mean_loss = loss_sum / accum
        if world > 1:
            dist.all_reduce(mean_loss, op=dist.ReduceOp.SUM)  # gloo has no AVG
            mean_loss /= world
        loss_value = float(mean_loss)  # NOTE: also the step's CUDA synchronisation point
        sync()
        dt = time.perf_counter() - t0
        stall = 100.0 * step_wait / dt if dt > 0 else 0.0
        result.losses.append(loss_value)
        result.stall.append(stall)
        result.wait.append(step_wait)
        result.dt.append(dt)
        result.step = step + 1
        if master and cfg.log_every and (step % cfg.log_every == 0 or step + 1 == last):
            say(f"step {step + 1:05d}/{cfg.steps:05d} | loss {loss_value:.4f} | lrm {lrm:.2f} | "
                f"tok/s {total / dt:,.0f} | data wait {1e3 * step_wait:.1f} ms ({stall:.1f}% stall) | "
                f"dt {1e3 * dt:.0f} ms")
        if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 != last:
            bpb(step + 1)
        if step + 1 == last or (cfg.save_every and (step + 1) % cfg.save_every == 0):
            checkpoint(step + 1)
    bpb(result.step)
    if cfg.core and result.step == cfg.steps:
        if tok is None:
            raise ConfigError("CORE needs the tokenizer: pass --tokenizer")
        model.eval()
        with autocast():
            result.core = run_core(model, tok, cfg.core, device=device, max_items=cfg.core_max_items, log=say)
        model.train()
    if world > 1:
        dist.barrier()
    result.model = model
    return result
