"""The training run's settings; apart from train.py so the CLI builds its flags without importing the model."""

from __future__ import annotations

from dataclasses import dataclass

from niels_gpt.constants import SEED

KINDS = ("windows", "indexed", "shards", "mixture", "parquet", "sft", "packed")  # what --data may hold
# the settings that take one of a few values: the CLI's choices, and what an API call is checked against
CHOICES = {"data_kind": ("auto", *KINDS), "sampling": ("random", "indexed", "shards"), "packing": ("bestfit", "contiguous"),
           "optimizer": ("muon", "adamw"), "attention": ("auto", "flex", "mask")}
EXIT_INTERRUPTED = 130  # the exit status of a run stopped by a signal, as a shell gives it


@dataclass(kw_only=True)
class TrainConfig:
    data: str
    out_dir: str = "runs/base"
    data_kind: str = "auto"
    sampling: str = "indexed"  # the global order (seed, epoch): a run resumes on any number of ranks
    shards_at_once: int = 8  # sampling="shards": shards read at a time (niels_gpt/loading/shard_windows.py)
    local_cache: str | None = None  # DATA at a URL: the download cache (default $NIELS_GPT_CACHE)
    cache_limit: str | None = None  # and its bound, e.g. 20GB (default $NIELS_GPT_CACHE_MAX_BYTES)
    packing: str = "bestfit"
    tokenizer: str | None = None
    prefetch: int = 4  # Parquet shards: batches tokenized ahead in the background (0: in the loop)
    # model (nanochat sizing from depth unless given; an --init-from checkpoint's shape)
    depth: int | None = None
    n_embd: int | None = None
    n_head: int | None = None
    n_kv_head: int | None = None
    sequence_len: int = 256
    vocab_size: int | None = None
    # batch
    device_batch_size: int = 8
    total_batch_size: int | None = None  # tokens per optimizer step; default one micro-batch per rank
    batch_ramp: str | None = None  # START:END:SAMPLES global rows per step, ramped over the first SAMPLES
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
    seed: int = SEED
    device: str = "auto"
    num_workers: int = 0
    compile: bool | None = None  # None: on for CUDA, off for CPU
    attention: str = "auto"  # document-masked attention: flex on CUDA, the explicit mask on CPU
    peak_tflops: float | None = None  # for MFU where the device is not in clock.PEAK_BF16_TFLOPS
    eval_every: int = 0
    eval_steps: int = 8
    core: str | None = None  # "bundled", a CORE bundle directory, or a URL of its zip
    core_max_items: int | None = None
    save_every: int = 0
    keep_last: int | None = None  # keep this run's newest N checkpoints, remove older ones (None: keep all)
    stop_at: int | None = None  # leave the loop after this step (checkpointing it): a planned interruption
    resume: str | None = None  # "latest" or a checkpoint path
    allow_new_order: bool = False  # --resume: go on from the position in a changed data order (else refused)
    init_from: str | None = None  # a checkpoint whose weights start this (new) run
    overwrite: bool = False  # --out-dir holds another run: replace it (at this run's first checkpoint)
    log_every: int = 1


# the command line's name of a field where it is not the field's own: one name per idea across the commands
FLAGS = {"sequence_len": "--seq-len", "num_workers": "--workers"}
OLD_FLAGS = {"sequence_len": "--sequence-len", "num_workers": "--num-workers"}  # still parsed, not shown


def flag_of(name: str) -> str:
    """The `train` flag of TrainConfig field `name`."""
    return FLAGS.get(name, "--" + name.replace("_", "-"))
