"""From a path to training batches: the library's loaders, chosen by what the path holds.

| the path holds                                | kind       | loader                                             |
|-----------------------------------------------|------------|----------------------------------------------------|
| a pretraining cache (meta.json kind pretrain) | `indexed`  | IndexedWindowDataset + GlobalBatchSampler + ResumableDataLoader |
|   same, with `sampling="random"`              | `windows`  | PretrainTokenStreamDataset + RankBatchStream        |
|   same, with `sampling="shards"`              | `shards`   | IndexedWindowDataset + ShardWindowSampler + ResumableDataLoader |
| a mixture file (.toml / .json)                | `mixture`  | MixtureConfig.build + ResumableDataLoader |
| Parquet text shards (a `text` column)         | `parquet`  | ParquetTokenLoader (last shard is val)              |
| an SFT cache (meta.json kind sft)             | `sft`      | SFTExampleDataset + RankBatchStream (labels = y_masked) |
| packed SFT bins (manifest.json / packed Parquet) | `packed` | open_packed + GlobalBatchSampler + ResumableDataLoader(collate_packed) |

A batch is a dict of contiguous int64 tensors on the device: `input_ids`, `labels` (-100: no target) and,
for packed bins, `position_ids` and `cu_seqlens`. A loader's state is the position after the last batch
taken, JSON-able. A cache at a URL is read through the download cache (niels_gpt/storage).
"""

from __future__ import annotations

import functools
from pathlib import Path
from types import SimpleNamespace

import torch

from niels_gpt.constants import META_NAME
from niels_gpt.errors import CacheError, ConfigError, FormatError
from niels_gpt.loading import (
    GlobalBatchSampler,
    IndexedWindowDataset,
    MixtureConfig,
    ParquetTokenLoader,
    RankBatchStream,
    ResumableDataLoader,
    split_files,
)
from niels_gpt.loading.sampler import batch_count
from niels_gpt.loading.shard_windows import ShardWindowSampler
from niels_gpt.locate import locate
from niels_gpt.meta import read_meta
from niels_gpt.packing import collate_packed, open_packed
from niels_gpt.readers.pretrain import PretrainTokenStreamDataset
from niels_gpt.readers.sft import SFTExampleDataset
from niels_gpt.seeds import check_seed
from niels_gpt.storage.remote import open_location
from niels_gpt.train.config import CHOICES, KINDS
from niels_gpt.train.pin import check_pins, pin, recorded_sha
from niels_gpt.train.setup import parse_batch_ramp
from niels_gpt.train.val import LAYOUT_KEYS, find_val_pack, val_batches
from niels_gpt.urls import is_url

URL_KINDS = ("windows", "indexed", "shards", "sft")
TRAINABLE = {"sft": "sft", "packed": "packed", "text-parquet": "parquet", "mixture": "mixture"}  # locate's kinds
WHAT_ELSE = {"root": "a directory of several outputs (a build-all root): pick one of them",
             "foreign": "token files of another format: `convert` them into a cache first"}
MODEL_KEYS = ("input_ids", "labels", *LAYOUT_KEYS)


def detect_kind(path, sampling: str = "indexed") -> str:
    """The loader kind for `path` (see the module table); ConfigError names what was found."""
    p = Path(path)
    try:
        found = locate(p)  # one door: the decision stats, inspect, verify and open_dataset make
    except (FormatError, CacheError) as exc:
        raise ConfigError(str(exc)) from None
    if found.kind == "pretrain" and found.split is None:
        if sampling not in CHOICES["sampling"]:
            raise ConfigError(f"sampling {sampling!r}: expected 'random' or 'indexed', or 'shards' (K shards at a time)")
        return {"random": "windows", "indexed": "indexed", "shards": "shards"}[sampling]
    if found.kind in TRAINABLE and found.split is None:
        return TRAINABLE[found.kind]
    if found.split is not None:
        raise ConfigError(f"{p}: the {found.split} split of the cache {found.root}: train on the cache directory "
                          f"({found.root}); it takes the train split and scores the val split")
    if found.kind == "not-built":
        raise ConfigError(f"{found.root}/meta.json: a placeholder (\"built\": false) that build-all left for an output "
                          "it did not build: build it (build-all --only NAME), then train")
    kind = found.meta.get("kind", found.kind) if found.kind == "tokenizer" else found.kind
    raise ConfigError(f"{p}/meta.json: kind {kind!r} is not trainable data (expected 'pretrain' or 'sft')"
                      if found.kind == "tokenizer" else
                      f"{p}: {WHAT_ELSE.get(found.kind, found.kind)}, not trainable data: train reads a cache, "
                      "a mixture, Parquet text shards or packed SFT bins")


def to_model_batch(raw, device: torch.device) -> dict[str, torch.Tensor]:
    """Any loader's batch -> {input_ids, labels, ...} on `device`: (x, y), (x, y, y_masked) or a dict."""
    if isinstance(raw, (tuple, list)):
        batch = {"input_ids": raw[0], "labels": raw[2] if len(raw) == 3 else raw[1]}
    else:
        # NOTE: the mixture's per-item dataset tag and collate_packed's max_seqlen are not tensors
        # the model takes; dropped here rather than in the loaders.
        batch = {k: v for k, v in raw.items() if k in MODEL_KEYS and isinstance(v, torch.Tensor)}
    out = {}
    for k, v in batch.items():
        if k != "cu_seqlens":
            v = v.long()
        v = v.contiguous()
        if v.device != device:
            v = v.to(device, non_blocking=device.type == "cuda" and v.is_pinned())
        out[k] = v
    return out


class EpochLoop:
    """A ResumableDataLoader iterated forever, epoch after epoch (a mixture's sampler has no end: one epoch)."""

    def __init__(self, loader):
        self.loader = loader
        self._it = None

    def __next__(self):
        while True:
            if self._it is None:
                self._it = iter(self.loader)
            try:
                return next(self._it)
            except StopIteration:
                self._it = None

    def state_dict(self) -> dict:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict, **order) -> None:
        self._it = None
        self.loader.load_state_dict(state, **order)

    def close(self) -> None:
        """End the iteration in progress (its workers, its assembling thread); the state stays the delivered one."""
        self._it = None
        self.loader.close()


def open_data(cfg: dict, data, *, rank: int, world: int, device, **given) -> TrainData:
    """The loader of `data` for `rank` of `world` as a run with settings `cfg` (a TrainConfig's dict, or a
    checkpoint's train_config) opens it: train, and trace replaying it."""
    ramp = parse_batch_ramp(SimpleNamespace(batch_ramp=cfg.get("batch_ramp"),
                                            total_batch_size=cfg.get("total_batch_size")), world)
    return TrainData(data, T=int(cfg["sequence_len"]), seed=cfg["seed"], device=device, rank=rank, world_size=world,
                     batch_size=ramp.steps[-1][1] // world if ramp else int(cfg["device_batch_size"]),
                     batch_schedule=ramp, kind=cfg.get("data_kind", "auto"), sampling=cfg.get("sampling", "indexed"),
                     packing=cfg.get("packing", "bestfit"), shards_at_once=int(cfg.get("shards_at_once", 8)), **given)


class TrainData:
    """`next(data)` -> a model batch of this rank; `state_dict()`; `val_batches(steps)`; `T`, `vocab_size`."""

    def __init__(self, path, *, T: int, batch_size: int, seed: int, device, rank: int = 0, world_size: int = 1,
                 kind: str = "auto", sampling: str = "indexed", num_workers: int = 0, tokenizer=None,
                 packing: str = "bestfit", vocab_size: int | None = None, prefetch: int = 0,
                 shards_at_once: int = 8, batch_schedule=None):
        self.url = str(path).rstrip("/") if is_url(path) else None
        # a URL: its mirror holds meta.json now and the shards as they are read
        self.path, self.device = Path(path) if self.url is None else open_location(self.url)[0], torch.device(device)
        self.kind = detect_kind(self.path, sampling) if kind == "auto" else kind
        if self.url is not None and self.kind not in URL_KINDS:
            raise ConfigError(f"{self.url}: {self.kind} data at a URL; train reads pretraining and SFT caches from "
                              "URLs: copy this down and train on the local path")
        self.shards_at_once = shards_at_once
        if self.kind not in KINDS:
            raise ConfigError(f"data kind {kind!r}: expected auto or one of {', '.join(KINDS)}")
        self.T, self.B, self.seed = int(T), int(batch_size), check_seed(seed)
        self.rank, self.world_size = rank, world_size
        self.num_workers, self.tokenizer, self.packing = num_workers, tokenizer, packing
        self.vocab_size, self.prefetch = None, prefetch  # the open fills in what the data records
        self._val = None
        self.origins = [self.path]  # where the data came from: the tokenizer is looked for above these
        self.tokenizer_sha256 = None  # the tokenizer packed bins record in their manifest (caches: meta.json)
        self.batch_schedule = batch_schedule  # global rows per step by samples delivered (--batch-ramp)
        if batch_schedule is not None and self.kind in ("mixture", "parquet"):
            raise ConfigError(f"--batch-ramp: {self.kind} data keeps one batch size; ramp the batch of a cache or "
                              "packed bins, or train without --batch-ramp")
        getattr(self, f"_open_{self.kind}")()
        if vocab_size is not None and self.vocab_size is not None and vocab_size < self.vocab_size:
            raise ConfigError(f"--vocab-size {vocab_size}: below the {self.vocab_size} ids {self.path} records: the "
                              f"model needs an embedding row for each; pass --vocab-size {self.vocab_size} or more")
        self.vocab_size = vocab_size or self.vocab_size
        self._pins = pin(self.origins)  # what the caches hold now: val reads them again later (pin.py)
        if self.vocab_size is None:
            raise ConfigError(f"{self.path}: the vocabulary size is not recorded with this data; pass --vocab-size "
                              "or --tokenizer")

    # -- the loaders -------------------------------------------------------------------------------
    def _rank_args(self) -> dict:
        ramp = {} if self.batch_schedule is None else {"batch_schedule": self.batch_schedule}
        return {"rank": self.rank, "world_size": self.world_size, **ramp}

    def _loader_kwargs(self) -> dict:
        return {"num_workers": self.num_workers, "pin_memory": self.device.type == "cuda",
                "persistent_workers": self.num_workers > 0}

    def _src(self, *parts: str) -> str:
        """A file or split of the data, as a URL when the data is at one."""
        return "/".join([self.url, *parts]) if self.url else str(self.path.joinpath(*parts))

    def _open_windows(self):
        ds = PretrainTokenStreamDataset(self._src("train"), T=self.T, device=str(self.device))
        self.vocab_size = self.vocab_size or ds.vocab_size
        self.source = RankBatchStream(ds, self.B * self.world_size, seed=self.seed, **self._rank_args())
        self._val = self._windows_val([self._src()])

    def _windows_val(self, caches: list) -> tuple | None:
        """The val split of those pretraining caches that have one (none: val bpb is skipped)."""
        def val_tokens(c) -> int:  # a URL's meta.json is read from its mirror
            return int(read_meta(self.path if self.url and str(c) == self.url else c)["totals"].get("val_tokens", 0))

        with_val = [c for c in caches if val_tokens(c)]
        return ("windows_val", with_val) if with_val else None

    def _open_indexed(self, sampler_class=GlobalBatchSampler, **order):
        ds = IndexedWindowDataset(self._src(), self.T, split="train")
        self.vocab_size = self.vocab_size or int(read_meta(self.path)["vocab_size"])
        sampler = sampler_class(ds, self.B * self.world_size, seed=self.seed, **order, **self._rank_args())
        self.source = EpochLoop(ResumableDataLoader(ds, sampler, **self._loader_kwargs()))
        self._val = self._windows_val([self._src()])

    def _open_shards(self):
        self._open_indexed(ShardWindowSampler, shards_at_once=self.shards_at_once)

    def _open_mixture(self):
        cfg = MixtureConfig.from_file(self.path)
        mix, sampler = cfg.build(self.T, self.B * self.world_size, **self._rank_args())
        vocab = {int(read_meta(d)["vocab_size"]) for d in cfg.datasets.values()}
        if len(vocab) != 1:
            raise ConfigError(f"{self.path}: the mixture's caches have different vocabularies {sorted(vocab)}; "
                              "mix caches built with one tokenizer")
        self.vocab_size = self.vocab_size or vocab.pop()
        self.origins = [Path(d) for d in cfg.datasets.values()]
        self.source = EpochLoop(ResumableDataLoader(mix, sampler, **self._loader_kwargs()))
        self._val = self._windows_val([Path(d) for d in cfg.datasets.values()])

    def _open_parquet(self):
        if self.tokenizer is None:
            raise ConfigError(f"{self.path}: Parquet text shards are tokenized while training; pass --tokenizer")
        self.vocab_size = self.vocab_size or len(self.tokenizer)
        self.source = ParquetTokenLoader(split_files(self.path, "train"), self.tokenizer, self.B, self.T,
                                         packing=self.packing, device=self.device, prefetch=self.prefetch,
                                         **self._rank_args())
        self._val = ("parquet_val", self.path)

    def _open_sft(self):
        meta = read_meta(self.path)
        self.vocab_size = self.vocab_size or int(meta["vocab_size"])
        eot = int(meta["special_token_ids"]["eot"])
        ds = SFTExampleDataset(self._src("train_tokens.bin"), self._src("train_idx.npy"), T=self.T,
                               device=str(self.device), eot_id=eot)
        self.source = RankBatchStream(ds, self.B * self.world_size, seed=self.seed, **self._rank_args())
        self._val = ("sft_val", eot) if meta["totals"].get("val_examples") else None

    def _open_packed(self):
        ds = open_packed(self.path)
        pack_size = int(getattr(ds, "pack_size", 0) or self.T)
        if pack_size != self.T:
            raise ConfigError(f"{self.path}: bins of pack_size {pack_size} for a context of T={self.T}: "
                              f"train packed bins with --seq-len {pack_size}")
        if self.vocab_size is None and self.tokenizer is not None:
            self.vocab_size = len(self.tokenizer)
        recorded = getattr(ds, "manifest", {}).get("source", {})
        self.tokenizer_sha256 = recorded_sha(recorded)
        source = Path(str(recorded.get("cache_dir", "")))
        if (source / META_NAME).is_file():  # the SFT cache the bins came from
            self.vocab_size = self.vocab_size or int(read_meta(source)["vocab_size"])
            self.origins.append(source)
        val = find_val_pack(self.path, T=self.T, tokenizer_sha256=self.tokenizer_sha256)
        self._val = ("packed_val", val) if val is not None else None
        sampler = GlobalBatchSampler(ds, self.B * self.world_size, seed=self.seed, **self._rank_args())
        collate = functools.partial(collate_packed, pad_to=self.T)
        self.source = EpochLoop(ResumableDataLoader(ds, sampler, collate_fn=collate, **self._loader_kwargs()))

    # -- the protocol ------------------------------------------------------------------------------
    def __iter__(self):
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        return to_model_batch(next(self.source), self.device)

    def state_dict(self) -> dict:
        return {"kind": self.kind, "loader": self.source.state_dict()}

    def epoch(self) -> float | None:
        """Passes over the train split so far, at the loop's position (None where the loader has no epoch)."""
        state = self.source.state_dict()
        if "samples_consumed" in state:  # a global sampler's delivered position
            return state["epoch"] + state["samples_consumed"] / self.source.loader.batch_sampler.usable
        per_epoch = {"windows": ("train_tokens", self.T), "sft": ("train_examples", 1)}.get(self.kind)
        if per_epoch is None or "step" not in state:
            return None
        if not hasattr(self, "_epoch_units"):  # read once: the log asks every step
            self._epoch_units = int(read_meta(self.path)["totals"].get(per_epoch[0], 0))
        units = self._epoch_units
        return state["step"] * self.B * self.world_size * per_epoch[1] / units if units else None

    def end_after(self, batches: int) -> None:
        """The run takes `batches` more batches: a remote cache's prefetching stops at the last one."""
        source = getattr(self.source, "loader", self.source)
        getattr(getattr(source, "batch_sampler", source), "end_after", lambda n: None)(batch_count(batches))

    def close(self) -> None:
        """Stop a loader's background work (the Parquet loader's prefetching, a DataLoader's workers or thread)."""
        getattr(self.source, "close", lambda: None)()

    def load_state_dict(self, state: dict, allow_new_order: bool = False) -> None:
        """allow_new_order: go on from the state's position in this data's order (not for Parquet shards)."""
        if state.get("kind") != self.kind:
            raise ConfigError(f"checkpoint's loader state is of kind {state.get('kind')!r}, this run reads "
                              f"{self.kind!r} data from {self.path}: resume with the same data")
        if allow_new_order and self.kind == "parquet":
            raise ConfigError(f"--allow-new-order: the loader of Parquet text shards ({self.path}) goes on only "
                              "from its own shards' documents: resume on the shards the run read, or start a new "
                              "run from the checkpoint's weights with --init-from")
        self.source.load_state_dict(state["loader"], **({"allow_new_order": True} if allow_new_order else {}))

    @property
    def has_val(self) -> bool:
        return self._val is not None

    def val_batches(self, steps: int) -> list:
        """This rank's share of the val split's first `steps` batches of B rows (val.py)."""
        if self._val is None:
            return []
        check_pins(self._pins)
        what, arg = self._val
        return val_batches(what, arg, T=self.T, B=self.B, rank=self.rank, world_size=self.world_size, steps=steps,
                           tokenizer=self.tokenizer, src=self._src)
