"""What a run needs before its first step: device and process group, tokenizer, model shape, resume checks.

Each check fails in one line naming the flag and the fix, before any data is read or checkpoint written.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist

from niels_gpt import allocator
from niels_gpt.constants import MODEL_NAME, SPLITS
from niels_gpt.errors import ConfigError, NielsGPTError, StateError
from niels_gpt.loading.schedule import batch_ramp
from niels_gpt.seeds import check_seed
from niels_gpt.storage.remote import open_location, tokenizer_near
from niels_gpt.tokenizer import load_tokenizer
from niels_gpt.tokenizer.find import LEVELS, tokenizer_of
from niels_gpt.train.checkpoint import checkpoint_file, latest_checkpoint
from niels_gpt.train.config import flag_of
from niels_gpt.train.eval_core import load_bundle
from niels_gpt.train.model import GPTConfig
from niels_gpt.train.pin import meta_of, recorded_sha, what_differs
from niels_gpt.urls import is_url, refuse_url

DEFAULT_DEPTH = 4


def resolve_device(device: str) -> torch.device:
    """`auto` (CUDA where there is one), `cpu`, `cuda` or `cuda:N`; ConfigError for anything torch cannot run."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"--device {device!r}: expected auto, cpu, cuda or cuda:N")
    if dev.type == "cuda" and not torch.cuda.is_available():
        why = ("this torch is a CPU-only build" if torch.version.cuda is None else "no CUDA device is visible")
        raise ConfigError(f"--device {device}: {why} (torch {torch.__version__}); run with --device cpu (or "
                          "auto), or install a CUDA build of torch")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ConfigError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return dev


def setup_distributed(device: str) -> tuple[int, int, torch.device]:
    """(rank, world_size, device); initialises the process group under torchrun."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    dev = resolve_device(device)
    if world > 1 and not dist.is_initialized():
        if dev.type == "cuda":
            dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
            torch.cuda.set_device(dev)
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    return rank, (dist.get_world_size() if dist.is_initialized() else 1), dev


def find_tokenizer(data_path: str | os.PathLike):
    """The tokenizer of the data at `data_path`, or None: a cache's by tokenizer/find.py's rule, a URL's from
    beside it, else a `tokenizer/` up to three levels above (the caller refuses one the data does not record).
    """
    if is_url(data_path):  # mirrored from beside the URL, once the cache there answers
        open_location(str(data_path))
        near = tokenizer_near(str(data_path))
        return load_tokenizer(near) if near is not None else None
    p = Path(data_path)
    if (recorded_sha(meta_of(p)) or recorded_sha(meta_of(p.parent))) and (tok := tokenizer_of(p)) is not None:
        return tok  # else a tokenizer/ found below is named as not the one recorded, and ignored
    for parent in [p.resolve(), *p.resolve().parents][:LEVELS + 1]:
        cand = parent / "tokenizer"
        if (cand / MODEL_NAME).is_file() or (cand / "tokenizer.json").is_file():
            return load_tokenizer(cand)
    return None


def check_data_url(url: str) -> None:
    """The URL of a cache's split (`.../cache/train`) where the cache's is meant: ConfigError naming the cache's."""
    try:
        open_location(url)
        return
    except NielsGPTError as exc:
        head, _, split = url.rstrip("/").rpartition("/")
        if split not in SPLITS:
            raise
        try:
            open_location(head)
        except NielsGPTError:
            raise exc from None
    raise ConfigError(f"{url}: the {split} split of the cache {head}: train on the cache's URL ({head}); it takes "
                      "the train split and scores the val split")


SHAPE = {"depth": "n_layer", "n_embd": "n_embd", "n_head": "n_head", "n_kv_head": "n_kv_head"}  # flag: field


def model_config(cfg, vocab_size: int, resumed: dict | None = None) -> GPTConfig:
    """The model of a fresh run: nanochat's sizing from --depth, unless width or heads are given; of a run
    `resumed` from a checkpoint's model: its shape where no model flag is given (an --init-from run's shape
    came from its base, by no flag)."""
    shape = {f: resumed[k] if resumed and getattr(cfg, f) is None else getattr(cfg, f) for f, k in SHAPE.items()}
    depth = DEFAULT_DEPTH if shape["depth"] is None else shape["depth"]
    base = GPTConfig.from_depth(depth, vocab_size=vocab_size, sequence_len=cfg.sequence_len)
    n_head = shape["n_head"] or base.n_head
    return GPTConfig(sequence_len=cfg.sequence_len, vocab_size=vocab_size, n_layer=depth, n_head=n_head,
                     n_kv_head=n_head if shape["n_kv_head"] is None else shape["n_kv_head"],
                     n_embd=shape["n_embd"] or base.n_embd)


def init_config(cfg, recorded: dict, vocab_size: int, source: str) -> GPTConfig:
    """The model of a run started from a checkpoint's weights: its shape (model flags must agree), this T."""
    for flag, key in SHAPE.items():
        given = getattr(cfg, flag)
        if given is not None and given != recorded[key]:
            raise ConfigError(f"{flag_of(flag)} {given}: the --init-from checkpoint {source} has "
                              f"{key} = {recorded[key]}; a run started from its weights keeps its shape: drop the flag")
    if vocab_size != recorded["vocab_size"]:
        raise ConfigError(f"--init-from {source}: its model has {recorded['vocab_size']} embedding rows, the data "
                          f"{cfg.data} has a vocabulary of {vocab_size}: train it on data built with the same "
                          "tokenizer (or pass --vocab-size to match)")
    return GPTConfig(**{**recorded, "sequence_len": cfg.sequence_len})


def resolve_resume(cfg) -> Path | None:
    if cfg.resume is None:
        return None
    if cfg.resume == "latest":
        if (found := latest_checkpoint(cfg.out_dir)) is None:
            raise StateError(f"--resume latest: no ckpt_*.pt in {cfg.out_dir}; start without --resume")
        return found
    return checkpoint_file(cfg.resume)


# what a resumed run cannot change: the optimizer state, the data order and the schedule it restores are
# theirs (--steps may change: the schedule follows it, and run.json records it)
RESUME_FIXED = ("seed", "optimizer", "sampling", "device_batch_size", "total_batch_size", "embedding_lr",
                "unembedding_lr", "matrix_lr", "adamw_matrix_lr", "weight_decay", "warmup_ratio", "warmdown_ratio",
                "final_lr_frac", "grad_clip", "packing", "shards_at_once", "batch_ramp")
# data kinds whose loader state is one global position (a function of seed, epoch and samples drawn): a run
# resumes from it on any number of ranks; the others hold a position per rank
WORLD_FREE = ("indexed", "shards", "packed", "mixture")


def check_resume(cfg, recorded: dict, world: int, recorded_world: int, source, kind: str = "") -> None:
    """Refuse a resume whose RESUME_FIXED flags (those acting on this data `kind` and optimizer) differ, and
    one on another number of ranks of data whose position is per rank."""
    def effective(config: dict, ranks: int) -> dict:  # no --total-batch-size: one micro-batch per rank
        tokens = config.get("device_batch_size", 0) * config.get("sequence_len", 0) * ranks
        return {**config, "total_batch_size": config.get("total_batch_size") or tokens}

    now, then = asdict(cfg), recorded
    if world != recorded_world or now["total_batch_size"] is not None or recorded.get("total_batch_size") is not None:
        # given once, or other ranks: compare the tokens a step takes
        now, then = effective(now, world), effective(recorded, recorded_world)
    idle = {"shards_at_once": cfg.sampling != "shards" or kind != "shards", "packing": kind != "parquet",
            "sampling": kind not in ("", "windows", "indexed", "shards"),
            "matrix_lr": cfg.optimizer != "muon", "adamw_matrix_lr": cfg.optimizer != "adamw"}
    changed = [(n, now[n], then[n]) for n in RESUME_FIXED
               if n in recorded and now[n] != then[n] and not idle.get(n, False)]
    if changed:
        flags = ", ".join(f"{flag_of(n)} {new} (the run has {old})" for n, new, old in changed)
        again = " ".join(f"{flag_of(n)} {old}" for n, _, old in changed)
        raise StateError(f"--resume {source}: {flags}: a resumed run goes on with the settings it started with (its "
                         f"optimizer state, data order and schedule are theirs): resume with {again}, or start a new "
                         f"run from its weights with --init-from {source} and another --out-dir")
    if recorded_world == world or kind in WORLD_FREE:
        return
    how = (" (a run with --sampling indexed, the default, resumes on any number of ranks; start one from this "
           f"checkpoint's weights with --init-from {source}, --sampling indexed and another --out-dir)"
           if kind == "windows" else "")
    raise StateError(f"--resume {source}: the run read {kind} data on {recorded_world} rank(s), each from its own "
                     f"position{' (--sampling random)' if kind == 'windows' else ''}; this resume has {world}: resume on {recorded_world} rank(s) "
                     f"(torchrun --nproc_per_node {recorded_world}){how}")


def regrouped(refusal: str) -> bool:
    """A loader's refusal that names only its global batch: the same order on other ranks, which goes on."""
    found = re.search(r"the order would change \((.*), state -> this run\)", refusal)
    return found is not None and {d.split(" ")[0] for d in found.group(1).split("; ")} == {"global_batch_size"}


def resume_loader(data, state: dict, ckpt: dict, caches: list, source, *, allow_new_order: bool = False) -> list:
    """Put the loader at the checkpoint's position; a changed order is refused unless `allow_new_order`.
    Returns the change run.json records ([{"step", "what"}], or [])."""
    try:
        data.load_state_dict(state)
        return []
    except StateError as exc:
        differs = what_differs(ckpt.get("caches"), caches)
        what = " ".join(str(exc).split())
        if differs is not None and ("tokenizer" in differs or not allow_new_order):
            # another tokenizer's ids mean other text to the model: no order makes that a resume
            allow = "" if "tokenizer" in differs else (", or go on from the same position in the new data's "
                                                      "order with --allow-new-order")
            raise StateError(f"--resume {source}: its loader state belongs to other data: {differs}: resume on the "
                             f"data the run trained on{allow}, or start a new run from its weights with --init-from "
                             f"{source} and another --out-dir") from exc
        if regrouped(what):  # the same order cut into other global batches: the trainer checked the step's tokens
            data.load_state_dict(state, allow_new_order=True)
            return []
        if not allow_new_order:
            if "allow_new_order=True" not in what:
                raise
            raise StateError(f"--resume {source}: {what.replace('pass allow_new_order=True', 'pass --allow-new-order')}"
                             ) from exc
        what = differs or what
    data.load_state_dict(state, allow_new_order=True)
    return [{"step": int(ckpt["step"]), "what": what}]


def parse_batch_ramp(cfg, world: int):
    """--batch-ramp START:END:SAMPLES as the loaders' BatchSchedule (rows a multiple of the ranks); None without it."""
    if cfg.batch_ramp is None:
        return None
    parts = cfg.batch_ramp.split(":")
    if len(parts) != 3 or not all(p.isdigit() for p in parts) or min(map(int, parts[:2])) < world:
        raise ConfigError(f"--batch-ramp {cfg.batch_ramp}: expected START:END:SAMPLES, integers, START and END "
                          f"global rows >= the {world} rank(s), e.g. --batch-ramp 8:32:2000")
    if cfg.total_batch_size is not None:
        raise ConfigError(f"--batch-ramp {cfg.batch_ramp} with --total-batch-size: a ramped step is one micro-batch "
                          "per rank of the ramp's rows; leave --total-batch-size out")
    first, last, samples = map(int, parts)
    return batch_ramp(first, last // world * world, samples, multiple=world)


# the least value of each number a run takes (None: not given), and what it means where the error should say
FLOORS = {"steps": (1, ""), "sequence_len": (1, ""), "device_batch_size": (1, ""), "total_batch_size": (1, ""),
          "stop_at": (1, ""), "keep_last": (1, "the newest checkpoints kept; leave it out to keep every checkpoint"),
          "eval_steps": (0, "val batches per bpb evaluation; 0 skips val bpb"), "eval_every": (0, "0: only at the end"),
          "prefetch": (0, "0: tokenize in the training loop"), "save_every": (0, "0: only the last step"),
          "core_max_items": (1, "leave it out to score every item"), "log_every": (0, "0: no step lines"),
          "num_workers": (0, "0: load in the training process"), "depth": (1, ""), "n_embd": (1, ""), "n_head": (1, ""),
          "n_kv_head": (1, "")}


def check_config(cfg) -> None:
    refuse_url(cfg.out_dir, "--out-dir")
    allocator.setting()  # a value of no known kind is refused before any work
    check_seed(cfg.seed)
    for name, (least, why) in FLOORS.items():
        if (value := getattr(cfg, name)) is not None and value < least:
            raise ConfigError(f"{flag_of(name)} {value}: must be >= {least}" + (f" ({why})" if why else ""))
    for name in ("warmup_ratio", "warmdown_ratio", "final_lr_frac"):  # shares: a negative final LR would ascend
        if not 0.0 <= (value := getattr(cfg, name)) <= 1.0:
            raise ConfigError(f"{flag_of(name)} {value}: must be in [0, 1] (a share of the steps, or of the peak rate)")
    if cfg.warmup_ratio + cfg.warmdown_ratio > 1.0:
        raise ConfigError(f"--warmup-ratio {cfg.warmup_ratio} and --warmdown-ratio {cfg.warmdown_ratio}: together "
                          "more than all the steps; their sum must be at most 1")
    if cfg.resume and cfg.init_from:
        raise ConfigError("--resume and --init-from both given: --resume continues a run (its weights, optimizer "
                          "and data position), --init-from starts a new one from another run's weights; pick one")
    if cfg.peak_tflops is not None and not cfg.peak_tflops > 0:
        raise ConfigError(f"--peak-tflops {cfg.peak_tflops}: must be > 0 (the device's dense bf16 TFLOP/s)")
    if cfg.core not in (None, "bundled") and not str(cfg.core).startswith(("http://", "https://")):
        load_bundle(cfg.core)  # CORE runs after the last step: a bundle it cannot read fails now, not then
