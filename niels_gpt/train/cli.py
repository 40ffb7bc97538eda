"""`train` and `sample` subcommands (train under torchrun for DDP); see docs/training.md.

Ctrl-C (or SIGTERM) during `train` saves the current step and prints the resume command (exit 130).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import MISSING, fields

from niels_gpt.args import hidden_alias
from niels_gpt.train.config import CHOICES, EXIT_INTERRUPTED, KINDS, OLD_FLAGS, TrainConfig, flag_of

HELP = {
    "out_dir": "checkpoints and run.json go here (another run's: refused without --resume or --overwrite)",
    "data_kind": f"auto (by what the path holds) or one of: {', '.join(KINDS)}",
    "sampling": "pretraining caches: indexed (one global order, resumes on any ranks), random or shards",
    "shards_at_once": "--sampling shards: shards read at a time (local disk for a cache at a URL)",
    "local_cache": "DATA at a URL: download cache directory (default $NIELS_GPT_CACHE)",
    "cache_limit": "DATA at a URL: size bound of the download cache, e.g. 20GB (default $NIELS_GPT_CACHE_MAX_BYTES)",
    "packing": "Parquet text shards: bestfit or contiguous",
    "tokenizer": "tokenizer dir/file (default: a tokenizer/ dir above the data; needed for bpb, CORE, Parquet)",
    "prefetch": "Parquet text shards: batches tokenized ahead in the background (0: in the training loop)",
    "depth": "layers; width 64 x depth, heads of ~128 dims (default: 4, or the --init-from checkpoint's)",
    "total_batch_size": "tokens per optimizer step, by grad accumulation (default: one micro-batch per rank)",
    "device_batch_size": "rows per micro-batch per rank",
    "optimizer": "muon (Muon for matrices + AdamW) or adamw (AdamW for everything)",
    "device": "auto, cpu, cuda or cuda:N",
    "num_workers": "DataLoader workers for the map-style kinds (indexed, mixture, packed)",
    "compile": "torch.compile the model (default: on for CUDA, off for CPU)",
    "attention": "attention of packed rows: auto (flex on CUDA, the explicit mask on CPU), flex or mask",
    "peak_tflops": "the device's peak dense bf16 TFLOP/s, for MFU (default: known GPUs' table)",
    "eval_every": "val bpb every N steps (0: only at the end)",
    "eval_steps": "val batches of --device-batch-size rows per bpb evaluation, shared by the ranks (0: no val bpb)",
    "core": "run CORE at the end: 'bundled', a bundle directory, or the bundle zip's URL (default: no CORE)",
    "save_every": "checkpoint every N steps (the last step, and a step ended by Ctrl-C, are always saved)",
    "keep_last": "keep the newest N checkpoints of this run, removing older ones (default: keep all)",
    "stop_at": "stop after this step (checkpointed), as an interrupted run would (default: run all --steps)",
    "resume": "'latest' (newest checkpoint in --out-dir) or a checkpoint path (default: start fresh)",
    "init_from": "start a new run from this checkpoint's weights, e.g. SFT after pretraining (default: none)",
    "overwrite": "--out-dir holds another run: replace it; with --resume of a checkpoint before the run's newest: "
                 "remove the later ones (either at this run's first checkpoint)",
    "n_embd": "model width (default: 64 x depth)",
    "n_head": "attention heads (default: width / 128, at least 1)",
    "n_kv_head": "key/value heads for grouped-query attention (default: as many as --n-head)",
    "sequence_len": "tokens per row (T)",
    "vocab_size": "embedding rows (default: the vocabulary the data records)",
    "steps": "optimizer steps",
    "embedding_lr": "AdamW learning rate of the token embedding",
    "unembedding_lr": "AdamW learning rate of the lm_head",
    "matrix_lr": "Muon learning rate of the matrices",
    "adamw_matrix_lr": "AdamW learning rate of the matrices with --optimizer adamw",
    "weight_decay": "AdamW weight decay",
    "warmup_ratio": "share of the steps spent warming the learning rate up",
    "warmdown_ratio": "share of the steps spent decaying the learning rate at the end",
    "final_lr_frac": "learning rate at the last step, as a share of the peak",
    "grad_clip": "clip the gradient norm to this (0: off)",
    "seed": "seed of the weights and of the data order (torch RNG)",
    "core_max_items": "score at most this many items per CORE task (default: all)",
    "log_every": "print a log line every N steps",
    "batch_ramp": "START:END:SAMPLES: global rows ramped over SAMPLES samples (default: a fixed batch)",
    "allow_new_order": "with --resume: go on from the checkpoint's position although the data order changed",
}


def register(sub) -> None:
    p = sub.add_parser("train")
    p.add_argument("data", help="what to train on (its kind is detected; see --data-kind)")
    for f in fields(TrainConfig):
        if f.name == "data":
            continue
        flag = flag_of(f.name)
        default = None if f.default is MISSING else f.default
        if f.name == "compile" or f.type in ("bool", bool):  # --compile/--no-compile: None leaves it to the device
            p.add_argument(flag, action=argparse.BooleanOptionalAction if f.name == "compile" else "store_true",
                           default=default, help=HELP[f.name])
            continue
        kind = {"int": int, "float": float}.get(str(f.type).split(" |")[0], str)
        action = p.add_argument(flag, dest=f.name, type=kind, default=default, choices=CHOICES.get(f.name),
                                help=HELP[f.name])
        if f.name in OLD_FLAGS:
            hidden_alias(p, OLD_FLAGS[f.name], action)
    p.set_defaults(func=run)

    s = sub.add_parser("sample")
    s.add_argument("checkpoint", help="a ckpt_<step>.pt written by train")
    s.add_argument("--prompt", required=True, help="the text to continue (with --chat: the user's message)")
    s.add_argument("--chat", action="store_true", help="render the prompt as a user turn and sample the assistant's")
    s.add_argument("--system", default=None, help="with --chat: a system prompt, the turn before the user's (default: none)")
    s.add_argument("--max-tokens", type=int, default=64, help="tokens to sample at most")
    s.add_argument("--temperature", type=float, default=0.8, help="0: always the most likely token")
    s.add_argument("--top-k", type=int, default=50, help="sample among the k most likely tokens (0: all)")
    s.add_argument("--seed", type=int, default=TrainConfig.seed, help="seed of the sampling (torch RNG)")
    s.add_argument("--tokenizer", default=None, help="tokenizer dir/file (default: the one the run recorded)")
    s.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    s.set_defaults(func=run_sample)


def run(args) -> int:
    import torch.distributed as dist

    # lazy: these import torch (the model torch._dynamo, ~1.5 s), which `train --help` does not need
    from niels_gpt.train.checkpoint import checkpoints, latest_checkpoint
    from niels_gpt.train.interrupt import resume_command
    from niels_gpt.train.train import train  # lazy: as above

    cfg = TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})
    world = int(os.environ.get("WORLD_SIZE", 1))
    # --overwrite: the checkpoints there are the replaced run's, not this one's, until this one saves
    theirs = {p: p.stat().st_mtime_ns for p in checkpoints(cfg.out_dir)} if cfg.overwrite and not cfg.resume else {}
    try:
        result = train(cfg)
    except KeyboardInterrupt:  # a Ctrl-C before the first step, or a second one inside a step
        last = latest_checkpoint(cfg.out_dir)
        last = None if last in theirs and theirs[last] == last.stat().st_mtime_ns else last
        where = (f"the last checkpoint is {last}; continue with: {resume_command(cfg, str(last), world)}"
                 if last else "no checkpoint of this run was written")
        print(f"error: train interrupted before its step ended; {where}", file=sys.stderr)
        return EXIT_INTERRUPTED
    if dist.is_initialized():
        first = dist.get_rank() == 0
        dist.destroy_process_group()
        if not first:
            return EXIT_INTERRUPTED if result.interrupted else 0
    if result.interrupted:
        print(f"error: interrupted ({result.interrupted}) after step {result.step} of {cfg.steps}; saved "
              f"{result.checkpoint}; continue with: {resume_command(cfg, result.checkpoint, world)}",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    if result.val_bpb:
        print(f"final val bpb {result.val_bpb[-1][1]:.4f}")
    return 0


def run_sample(args) -> int:
    from niels_gpt.train.sample import SampleInterrupted, sample  # lazy: the model imports torch._dynamo

    def show(text: str) -> None:
        print(f"{args.prompt}{' ->' if args.chat else ''}{text if not args.chat else ' ' + text}", flush=True)

    try:
        text = sample(args.checkpoint, args.prompt, chat=args.chat, max_tokens=args.max_tokens,
                      temperature=args.temperature, top_k=args.top_k, seed=args.seed, tokenizer=args.tokenizer,
                      device=args.device, system=args.system)
    except SampleInterrupted as stopped:  # what was written so far, then why it ends there
        show(stopped.text)
        print(f"error: sample interrupted after {stopped.tokens} of at most {args.max_tokens} tokens; the text above "
              "is what the model wrote until then", file=sys.stderr)
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:  # before the first token: the checkpoint was still loading
        print("error: sample interrupted before the model wrote anything", file=sys.stderr)
        return EXIT_INTERRUPTED
    show(text)
    return 0
