"""The base training loop (nanochat's base_train, small): one step = grad accumulation to a token batch.

- step: per micro-batch forward (bf16 autocast on CUDA), backward, fetch the next batch (overlapping the
  GPU's backward); clip; LR and Muon momentum from the schedule; step AdamW and Muon;
- log: loss, lr multiplier, tokens/s, MFU (clock.py) and the data wait (host time inside next(data));
- eval: val bpb every eval_every steps and at the end; CORE at the end when asked;
- checkpoint: model, optimizers, step, RNG and every rank's loader state (checkpoint.py); a resumed run
  gives the same losses bit for bit on CPU; a non-finite loss stops the run before it saves;
  SIGINT/SIGTERM save the step and return (interrupt.py).

DDP under torchrun: gloo on CPU, nccl on CUDA. torch.compile is on by default on CUDA, off on CPU.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from niels_gpt import allocator
from niels_gpt.errors import ConfigError, NielsGPTError, StateError, first_few
from niels_gpt.loading import token_bytes as tokenizer_bytes
from niels_gpt.output_guard import check_overlap
from niels_gpt.storage.settings import apply_cache_args
from niels_gpt.tokenizer import check_tokenizer_matches, load_tokenizer
from niels_gpt.train.attention import resolve as resolve_attention
from niels_gpt.train.checkpoint import (
    check_out_dir,
    checkpoint_name,
    latest_checkpoint,
    load_checkpoint,
    prune_checkpoints,
    remove_files,
    run_lock,
    save_checkpoint,
)
from niels_gpt.train.clock import RunClock, mfu, peak_tflops
from niels_gpt.train.config import TrainConfig
from niels_gpt.train.data import open_data
from niels_gpt.train.eval_core import run_core
from niels_gpt.train.interrupt import StopRequests
from niels_gpt.train.model import GPT
from niels_gpt.train.optim import Muon, build_optimizers, lr_multiplier, muon_momentum
from niels_gpt.train.pin import meta_of, recorded_sha, summary
from niels_gpt.train.setup import (
    check_config,
    check_data_url,
    check_resume,
    find_tokenizer,
    init_config,
    model_config,
    resolve_resume,
    resume_loader,
    setup_distributed,
)
from niels_gpt.train.val import LAYOUT_KEYS, score
from niels_gpt.urls import is_url

__all__ = ["TrainConfig", "TrainResult", "DivergedError", "train", "model_config", "latest_checkpoint",
           "load_checkpoint"]


class DivergedError(NielsGPTError):
    """The loss (or val bpb) stopped being a finite number: the run stops before it saves."""


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
    mfu: list[float] = field(default_factory=list)  # per step, where the peak is known (clock.py)
    interrupted: str | None = None  # the signal that stopped the run (its last step saved)
    model: torch.nn.Module | None = None
    rows: list[list[list[int]]] = field(default_factory=list)  # input rows per micro-batch (record_rows=True)


def train(cfg: TrainConfig, *, token_bytes: torch.Tensor | None = None, log=print,
          record_rows: bool = False, data=None) -> TrainResult:
    """Run (or resume) a training run. `token_bytes` replaces the tokenizer's byte lengths for bpb;
    `record_rows` keeps every input row; `data` replaces the loader of cfg.data (TrainData's protocol)."""
    check_config(cfg)
    if data is None and is_url(cfg.data):  # read through the download cache (docs/storage.md)
        apply_cache_args(cfg.local_cache, cfg.cache_limit)
        check_data_url(cfg.data)
    resolve_attention(cfg.attention, torch.device("cpu"))  # a bad value fails here, before any work
    resume_from = resolve_resume(cfg)
    inputs = [d.strip() for d in str(cfg.data).split(",") if not is_url(d.strip())]
    inputs += [cfg.tokenizer] if cfg.tokenizer else []
    check_out_dir(cfg.out_dir, data=inputs, init_from=cfg.init_from, resume=resume_from, overwrite=cfg.overwrite)
    with contextlib.ExitStack() as held:
        if int(os.environ.get("RANK", 0)) == 0:  # one lock per run, however many ranks write it
            held.enter_context(run_lock(cfg.out_dir))
        # again under the lock: a run that held it a moment ago may have written the directory since
        old_run = check_out_dir(cfg.out_dir, data=inputs, init_from=cfg.init_from, resume=resume_from,
                                overwrite=cfg.overwrite)
        base = load_checkpoint(cfg.init_from, flag="--init-from") if cfg.init_from else None
        rank, world, device = setup_distributed(cfg.device)
        if resolve_attention(cfg.attention, device) == "flex" and device.type != "cuda":
            raise ConfigError(f"--attention flex on {device}: torch runs flex_attention's backward on CUDA only; "
                              "train on CPU with --attention mask (or auto)")
        say = log if rank == 0 else (lambda *a, **k: None)
        # on CPU, freed memory is kept for the next step while the run works (niels_gpt/allocator.py)
        if held.enter_context(allocator.kept() if device.type == "cpu" else contextlib.nullcontext(False)):
            say("cpu: malloc keeps freed memory for the next step (NIELS_GPT_MALLOC=system leaves it as it was)")
        tok = None
        if cfg.tokenizer:
            tok = load_tokenizer(cfg.tokenizer)
        elif token_bytes is None:
            tok = find_tokenizer(cfg.data)
        if data is None:
            data = open_data(asdict(cfg), cfg.data, rank=rank, world=world, device=device, tokenizer=tok,
                             vocab_size=cfg.vocab_size, num_workers=cfg.num_workers, prefetch=cfg.prefetch)
        held.callback(getattr(data, "close", lambda: None))
        # a mixture's caches (or the SFT cache packed bins came from) are inputs too, known once data is open
        check_overlap(Path(cfg.out_dir).resolve(), getattr(data, "origins", ()), "--out-dir", what="data")
        return _run(cfg, data, tok, token_bytes, base, resume_from, old_run, rank, world, device, say, record_rows)


def _run(cfg, data, tok, token_bytes, base, resume_from, old_run, rank, world, device, say, record_rows):
    master = rank == 0
    if tok is None and token_bytes is None:
        tok = next(filter(None, (find_tokenizer(p) for p in getattr(data, "origins", ())[1:])), None)
    # the tokenizer the data records: packed bins' manifest (their SFT cache may be gone), else meta.json
    recorded = getattr(data, "tokenizer_sha256", None) or \
        recorded_sha(meta_of(getattr(data, "origins", [Path(cfg.data)])[-1]))
    if cfg.tokenizer:  # bpb is scored with its byte lengths: it must be the one each cache (a mixture's, the SFT
        # cache of packed bins; a URL's mirror) and packed bins' manifest record
        check_tokenizer_matches(tok, getattr(data, "tokenizer_sha256", None), cfg.data)
        for where in getattr(data, "origins", ()):
            check_tokenizer_matches(tok, recorded_sha(meta_of(where)), where)
    elif tok is not None:
        # a tokenizer found by looking around must be the one the cache records, or bpb would be wrong
        if recorded and recorded != tok.sha256:
            say(f"{tok.model_path}: not the tokenizer {cfg.data} was built with (sha256 {recorded[:12]}...); "
                "ignored: pass --tokenizer")
            tok = None
    if token_bytes is None and tok is not None:
        token_bytes = tokenizer_bytes(tok)
    if cfg.core and tok is None:  # CORE runs after the last step: refused before the first
        raise ConfigError("--core needs the tokenizer the data was built with, and none was found: pass --tokenizer")
    data_sha = tok.sha256 if tok is not None else recorded  # a tokenizer kept above is the recorded one
    base_sha = base.get("tokenizer_sha256") if base is not None else None
    if base_sha and data_sha and base_sha != data_sha:
        raise ConfigError(f"--init-from {cfg.init_from}: its model was trained with another tokenizer (sha256 "
                          f"{base_sha[:12]}...) than {cfg.data} was built with ({data_sha[:12]}...): its ids "
                          f"would mean other text; train on data built with the base run's tokenizer "
                          f"({base.get('tokenizer') or 'the one its run recorded'})")
    tokens_per_micro = cfg.device_batch_size * cfg.sequence_len * world
    total = cfg.total_batch_size or tokens_per_micro
    if total % tokens_per_micro:
        raise ConfigError(f"total_batch_size {total} is not a multiple of device_batch_size x sequence_len x "
                          f"world_size = {tokens_per_micro}: pick a multiple")
    accum = total // tokens_per_micro

    ckpt = load_checkpoint(resume_from) if resume_from is not None else None
    last = cfg.steps if cfg.stop_at is None else min(cfg.steps, cfg.stop_at)
    if ckpt is not None:
        check_resume(cfg, ckpt["train_config"], world, len(ckpt["loader"]), resume_from, getattr(data, "kind", ""))
        if last < ckpt["step"]:  # the loop would run no step, and the run would say nothing of it
            flag = "--steps" if last == cfg.steps else "--stop-at"
            raise ConfigError(f"--resume {resume_from}: the run is at step {ckpt['step']}, past {flag} {last}: nothing "
                              f"to train; give {flag} above {ckpt['step']}")
    vocab = data.vocab_size
    caches = summary(getattr(data, "origins", ()))
    mcfg = (init_config(cfg, base["model_config"], vocab, cfg.init_from) if base else
            model_config(cfg, vocab, ckpt["model_config"] if ckpt else None))
    torch.manual_seed(cfg.seed)
    model = GPT(mcfg).to(device)
    model.attention = cfg.attention
    model.init_weights(torch.Generator(device=device).manual_seed(cfg.seed))
    if base is not None:
        model.load_state_dict(base["model"])
        say(f"weights from {cfg.init_from} (step {base['step']} of a run on {base['train_config'].get('data')}); "
            "optimizer state and data position start fresh")
    optimizers = build_optimizers(model, cfg)
    start = 0
    if ckpt is not None:
        if ckpt["model_config"] != asdict(mcfg):
            raise StateError(f"{resume_from}: model {ckpt['model_config']} differs from this run's {asdict(mcfg)}: "
                             "resume with the same model flags")
        model.load_state_dict(ckpt["model"])
        for opt, state in zip(optimizers, ckpt["optimizers"], strict=True):
            opt.load_state_dict(state)
        states = ckpt["loader"]
        new_order = resume_loader(data, states[rank] if len(states) == world else states[0], ckpt, caches,
                                  resume_from, allow_new_order=cfg.allow_new_order)
        torch.set_rng_state(ckpt["rng"]["cpu"])
        if device.type == "cuda" and ckpt["rng"]["cuda"]:
            torch.cuda.set_rng_state_all(ckpt["rng"]["cuda"])
        start = int(ckpt["step"])
        say(f"resumed from {resume_from} at step {start}" + ("" if ckpt["verified"] else
                                                             " (an older checkpoint without a checksum: not verified)"))

    train_model = model
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        train_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    cuda = device.type == "cuda"
    compiled = cuda if cfg.compile is None else cfg.compile
    if compiled:
        train_model = torch.compile(train_model)
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if cuda else contextlib.nullcontext
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    peak = peak_tflops(device, cfg.peak_tflops)
    flops = model.flops_per_token()

    say(f"data: {data.kind} from {cfg.data} | model: {mcfg.n_layer} layers, {mcfg.n_embd} wide, {mcfg.n_head} heads "
        f"({mcfg.n_kv_head} kv), {model.num_params():,} parameters | batch {total:,} tokens = {accum} x "
        f"{cfg.device_batch_size} x {cfg.sequence_len} x {world} rank(s) | {cfg.optimizer} | device {device}"
        f"{' | compiled' if compiled else ''}")
    say("data wait = host time inside next(data) per step (loader + copy to the device; docs/training.md)"
        + ("" if peak else "; MFU: pass --peak-tflops for this device"))

    if cfg.eval_steps == 0:
        say("--eval-steps 0: val bpb is skipped")
    elif token_bytes is None:
        say("no tokenizer found above the data and none given (--tokenizer): val bpb is skipped")
    elif not data.has_val:
        hint = {"packed": f" (pack-sft packs the SFT cache's val split into {Path(cfg.data) / 'val'} itself: pack "
                          "them again without --no-val)"}
        say(f"{cfg.data}: no val split in this data: val bpb is skipped{hint.get(data.kind, '')}")
    else:  # a val split no row fits fails now, not at the first evaluation (with the steps since a save)
        try:
            data.val_batches(1)
        except ConfigError as exc:
            raise ConfigError(f"{exc}; or pass --eval-steps 0 to train without val bpb") from None
    result = TrainResult(step=start)
    out = Path(cfg.out_dir)

    def bpb(step: int) -> None:
        if token_bytes is None or not data.has_val or cfg.eval_steps == 0:
            return
        model.eval()
        with autocast():
            value = score(model, data.val_batches(cfg.eval_steps), token_bytes.to(device))
        model.train()
        if not math.isfinite(value):
            raise DivergedError(f"step {step}: val bits per byte is {value}; stopped before saving anything, so "
                                f"{out} keeps only what earlier steps saved: lower the learning rates or check the data")
        result.val_bpb.append((step, value))
        say(f"step {step:05d} | val bpb {value:.4f}")

    def checkpoint(step: int) -> None:
        states = [loader_state] if world == 1 else [None] * world
        if world > 1:
            dist.all_gather_object(states, loader_state)
        if master:
            if old_run:  # --overwrite: the run that was here (or its later checkpoints) goes now that this one
                remove_files(old_run)  # has something to keep
                say(f"--overwrite: removed {first_few([p.name for p in old_run])} from {out}")
                old_run.clear()
            path = out / checkpoint_name(step)
            payload = {"step": step, "model": model.state_dict(), "optimizers": [o.state_dict() for o in optimizers],
                       "loader": states, "model_config": asdict(mcfg), "train_config": asdict(cfg),
                       "tokenizer": str(tok.model_path) if tok is not None else None,
                       "tokenizer_sha256": data_sha, "caches": caches,
                       "order_changes": [*ckpt.get("order_changes", []), *new_order] if ckpt else [],
                       "rng": {"cpu": torch.get_rng_state(),
                               "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}}
            save_checkpoint(path, payload)
            result.checkpoint = str(path)
            pruned = prune_checkpoints(out, cfg.keep_last, path) if cfg.keep_last else []
            say(f"step {step:05d} | checkpoint {path}" + (f" (--keep-last {cfg.keep_last}: removed "
                                                           f"{', '.join(p.name for p in pruned)})" if pruned else ""))

    getattr(data, "end_after", lambda n: None)((cfg.steps - start) * accum)  # no prefetch past the last step
    t_wait = time.perf_counter()
    batch = next(data)
    wait = time.perf_counter() - t_wait
    top = int(batch["input_ids"].max())  # data that records no vocabulary (packed bins whose cache is gone)
    if top >= mcfg.vocab_size:
        raise ConfigError(f"{cfg.data}: token id {top} in the first batch, but the model has {mcfg.vocab_size} "
                          f"embedding rows{' (--vocab-size)' if cfg.vocab_size else ''}: pass --vocab-size above "
                          f"{top} (the vocabulary of the tokenizer the data was built with)")
    loader_state = data.state_dict()
    clock = RunClock(start, last)
    with StopRequests() as stop:
        for step in range(start, last):
            sync()
            t0 = time.perf_counter()
            step_wait, wait = wait, 0.0
            loss_sum = torch.zeros((), device=device)
            total = batch["input_ids"].numel() * world if cfg.batch_ramp else total  # a ramp's step: its rows
            for micro in range(accum):
                if record_rows:
                    result.rows.append(batch["input_ids"].tolist())
                sync_ctx = train_model.no_sync if (world > 1 and micro < accum - 1) else contextlib.nullcontext
                with sync_ctx():
                    with autocast():
                        loss = train_model(batch["input_ids"], batch["labels"],
                                           **{k: batch.get(k) for k in LAYOUT_KEYS})
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
                        group["momentum"] = muon_momentum(step)
                opt.step()
            model.zero_grad(set_to_none=True)
            mean_loss = loss_sum / accum
            if world > 1:
                dist.all_reduce(mean_loss, op=dist.ReduceOp.SUM)  # gloo has no AVG
                mean_loss /= world
            loss_value = float(mean_loss)  # NOTE: also the step's CUDA synchronisation point
            sync()
            if not math.isfinite(loss_value):
                raise DivergedError(f"step {step + 1}: the loss is {loss_value}; stopped before saving anything, so "
                                    f"{out} keeps only what earlier steps saved: lower the learning rates "
                                    "(--matrix-lr, --embedding-lr), or check the data and the checkpoint it started from")
            dt = time.perf_counter() - t0
            stall = 100.0 * step_wait / dt if dt > 0 else 0.0
            util = mfu(flops, total / dt, peak, world) if dt > 0 else None
            result.losses.append(loss_value)
            result.stall.append(stall)
            result.wait.append(step_wait)
            result.dt.append(dt)
            if util is not None:
                result.mfu.append(util)
            result.step = step + 1
            if master and cfg.log_every and (step % cfg.log_every == 0 or step + 1 == last):
                say(f"step {step + 1:05d}/{cfg.steps:05d} | loss {loss_value:.4f} | lrm {lrm:.2f} | "
                    f"tok/s {total / dt:,.0f}{'' if util is None else f' | mfu {util:.1f}%'} | "
                    f"data wait {1e3 * step_wait:.1f} ms ({stall:.1f}% of dt) | dt {1e3 * dt:.0f} ms"
                    + clock.fields(step + 1, getattr(data, "epoch", lambda: None)()))
            if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 != last:
                bpb(step + 1)
            saved = step + 1 == last or (cfg.save_every and (step + 1) % cfg.save_every == 0)
            if saved:
                checkpoint(step + 1)
            if stop.requested(device):  # in the last step too: no val bpb nor CORE after it
                if not saved:
                    checkpoint(step + 1)
                result.interrupted = stop.signal
                say(f"step {step + 1:05d} | {stop.signal}: stopped after this step, saved")
                break
    if result.interrupted is None:
        bpb(result.step)
    if cfg.core and result.step == cfg.steps and result.interrupted is None:
        model.eval()
        with autocast():
            result.core = run_core(model, tok, cfg.core, device=device, max_items=cfg.core_max_items, log=say)
        model.train()
    if world > 1:
        dist.barrier()
    result.model = model
    return result
