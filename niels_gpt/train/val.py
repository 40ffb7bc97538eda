"""What a run scores for val bpb: the val split's first `steps` batches of B rows, batch i on rank i % world,
so the same weights score the same on any number of ranks. Packed bins' val pack is `<bins>/val` (or
`<dir>/val` beside `<dir>/train`), scored with its document layout as training reads it.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch

from niels_gpt.errors import ConfigError, NielsGPTError
from niels_gpt.loading import IndexedWindowDataset, ParquetTokenLoader, evaluate_bpb, split_files
from niels_gpt.packing import collate_packed, open_packed
from niels_gpt.readers.sft import SFTExampleDataset
from niels_gpt.train.pin import recorded_sha

LAYOUT_KEYS = ("position_ids", "cu_seqlens", "doc_ids")


def find_val_pack(bins: Path, *, T: int, tokenizer_sha256: str | None) -> Path | None:
    """The val pack of packed train bins (the module docstring), or None; ConfigError for one that does
    not fit them (another pack size, another tokenizer)."""
    candidates = [bins / "val"] + ([bins.parent / "val"] if bins.name == "train" else [])
    for cand in candidates:
        if not cand.is_dir():
            continue
        try:
            ds = open_packed(cand)
        except NielsGPTError:
            continue
        size = int(getattr(ds, "pack_size", 0) or T)
        sha = recorded_sha(getattr(ds, "manifest", {}).get("source", {}))
        if size != T:
            raise ConfigError(f"{cand}: the val pack of {bins} has pack_size {size}, the train bins {T}: pack the val "
                              f"split again with --seq-len {T}")
        if sha and tokenizer_sha256 and sha != tokenizer_sha256:
            raise ConfigError(f"{cand}: the val pack of {bins} was made with another tokenizer (sha256 {sha[:12]}...) "
                              f"than the train bins ({tokenizer_sha256[:12]}...): pack the val split of the same "
                              "SFT cache again")
        return cand
    return None


def val_batches(what: str, arg, *, T: int, B: int, rank: int, world_size: int, steps: int, tokenizer=None,
                src=None) -> list:
    """This rank's share of the first `steps` val batches of B rows (the module docstring)."""
    mine = range(rank, steps, world_size)
    if what == "windows_val":
        sets = [IndexedWindowDataset(d, T, split="val") for d in arg]
        ds = torch.utils.data.ConcatDataset(sets) if len(sets) > 1 else sets[0]
        rows, count = (B, min(steps, len(ds) // B)) if len(ds) >= B else (len(ds), 1 if len(ds) else 0)
        out = []
        for i in (i for i in mine if i < count):
            items = [ds[j] for j in range(i * rows, (i + 1) * rows)]
            out.append((torch.stack([it["input_ids"] for it in items]), torch.stack([it["labels"] for it in items])))
        return out
    if what == "parquet_val":
        loader = ParquetTokenLoader(split_files(arg, "val"), tokenizer, B, T, packing="contiguous", rank=0,
                                    world_size=1)
        try:
            batches = [next(loader) for _ in range(steps)]
        finally:  # its producer thread and open files end here, not when the loader is collected
            loader.close()
        return [batches[i] for i in mine]
    if what == "packed_val":
        ds = open_packed(arg)
        collate = functools.partial(collate_packed, pad_to=T)
        return [collate([ds[j] for j in range(i * B, min((i + 1) * B, len(ds)))]) for i in mine if i * B < len(ds)]
    ds = SFTExampleDataset(src("val_tokens.bin"), src("val_idx.npy"), T=T, device="cpu", eot_id=arg)
    batches = (ds.collate(np.arange(i * B, min((i + 1) * B, len(ds)))) for i in mine if i * B < len(ds))
    return [(x, y_masked) for x, _, y_masked in batches]


def score(model, batches, token_bytes: torch.Tensor) -> float:
    """Bits per byte of `model` over val batches (tuples, or dicts with a document layout), all ranks."""
    layout: dict = {}  # the layout of the batch being scored: evaluate_bpb scores each before taking the next

    def pairs():
        for b in batches:
            layout.clear()
            if isinstance(b, dict):
                given = [k for k in LAYOUT_KEYS if isinstance(b.get(k), torch.Tensor)]
                layout.update((k, b[k].to(token_bytes.device)) for k in given)
                b = (b["input_ids"], b["labels"])
            yield b

    return evaluate_bpb(lambda x: model(x, **layout), pairs(), token_bytes)
