"""`train` subcommand: python -m niels_gpt.cli train DATA [flags]; under torchrun for DDP.

    python -m niels_gpt.cli train cache-demo/pretrain/wikitext --depth 2 --steps 100
    torchrun --nproc_per_node 8 -m niels_gpt.cli train cache/pretrain/fineweb_edu --depth 20 \
        --sequence-len 2048 --device-batch-size 32 --total-batch-size 524288 --core https://...zip
"""

from __future__ import annotations

from dataclasses import MISSING, fields

from niels_gpt.train.data import KINDS
from niels_gpt.train.train import TrainConfig, train

HELP = {
    "out_dir": "checkpoints go here (ckpt_<step>.pt)",
    "data_kind": f"auto (by what the path holds) or one of: {', '.join(KINDS)}",
    "sampling": "pretraining caches: random windows, indexed windows with the global sampler, or shards (K at a time)",
    "shards_at_once": "--sampling shards: shards read at a time (local disk for a cache at a URL)",
    "local_cache": "DATA at a URL (s3://, gs://, hf://, http(s)://): download cache directory (default $NIELS_GPT_CACHE)",
    "cache_limit": "DATA at a URL: size bound of the download cache, e.g. 20GB (default $NIELS_GPT_CACHE_MAX_BYTES)",
    "packing": "Parquet text shards: bestfit or contiguous",
    "tokenizer": "tokenizer dir/file (default: a tokenizer/ dir above the data; needed for bpb, CORE, Parquet)",
    "depth": "layers; width = 64 x depth and heads of ~128 dims unless given",
    "total_batch_size": "tokens per optimizer step, made up by gradient accumulation (default: one micro-batch per rank)",
    "device_batch_size": "rows per micro-batch per rank",
    "optimizer": "muon (Muon for matrices + AdamW) or adamw (AdamW for everything)",
    "device": "auto, cpu, cuda",
    "num_workers": "DataLoader workers for the map-style kinds (indexed, mixture, packed)",
    "eval_every": "val bpb every N steps (0: only at the end)",
    "eval_steps": "val batches per bpb evaluation",
    "core": "run CORE at the end: 'bundled', a bundle directory, or the bundle zip's URL (default: no CORE)",
    "save_every": "checkpoint every N steps (the last step is always saved)",
    "stop_at": "stop after this step (checkpointed), as an interrupted run would (default: run all --steps)",
    "resume": "'latest' (newest checkpoint in --out-dir) or a checkpoint path (default: start fresh)",
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
    "compile": "torch.compile the model",
}


def register(sub) -> None:
    p = sub.add_parser("train", help="train the GPT on a cache, mixture, Parquet shards or packed SFT bins")
    p.add_argument("data", help="what to train on (its kind is detected; see --data-kind)")
    for f in fields(TrainConfig):
        if f.name == "data":
            continue
        flag = "--" + f.name.replace("_", "-")
        default = None if f.default is MISSING else f.default
        if f.type in ("bool", bool):
            p.add_argument(flag, action="store_true", help=HELP[f.name])
            continue
        kind = {"int": int, "float": float}.get(str(f.type).split(" |")[0], str)
        choices = {"data_kind": ["auto", *KINDS], "sampling": ["random", "indexed", "shards"],
                   "packing": ["bestfit", "contiguous"], "optimizer": ["muon", "adamw"]}.get(f.name)
        p.add_argument(flag, type=kind, default=default, choices=choices, help=HELP[f.name])
    p.set_defaults(func=run)


def run(args) -> int:
    values = {f.name: getattr(args, f.name) for f in fields(TrainConfig)}
    cfg = TrainConfig(**values)
    result = train(cfg)
    import torch.distributed as dist

    if dist.is_initialized():
        first = dist.get_rank() == 0
        dist.destroy_process_group()
        if not first:
            return 0
    if result.val_bpb:
        print(f"final val bpb {result.val_bpb[-1][1]:.4f}")
    return 0
