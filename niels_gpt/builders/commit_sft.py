"""The SFT commit: the rendered parts of a chat build's tasks, in plan order, through the one-process
builder's `SFTWriter`, so the draws, files and meta.json are the same. Parts are checked against receipts.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from niels_gpt.builders.commit import _counted, _documents
from niels_gpt.builders.common import start_build
from niels_gpt.builders.origins import InputIndex, input_table
from niels_gpt.builders.sft import SFTWriter, check_sft_settings, sft_meta
from niels_gpt.meta import write_meta


def commit_sft(work_dir, receipts: Iterable[dict], out_dir, *, tokenizer, val_frac: float, seed: int,
               dataset_name: str | None = None, dataset_config: str | None = None, streaming: bool = False,
               source: dict | Callable[[], dict] | None = None, final: str | os.PathLike | None = None,
               tokenizer_path: str | None = None, plan=None) -> dict:
    """Write the SFT cache at `out_dir` from the parts of `receipts` (in plan order); returns meta. `plan`: the
    build's plan, whose inputs the examples' origins name (builders/origins.py); None writes no origins."""
    check_sft_settings(val_frac, seed)
    out = Path(out_dir)
    dtype = np.dtype(tokenizer.token_dtype)
    stored_mask = not getattr(tokenizer, "library_conventions", True)
    start_build(out, [])
    skipped, encoders = Counter(), Counter()  # encoders: the tasks by the encoder each ran (meta.json's record)
    writer = SFTWriter(out, dtype, stored_mask=stored_mask, val_frac=val_frac, seed=seed, origins=plan is not None)
    index = InputIndex(plan.inputs) if plan is not None else None
    try:
        for d in _documents(work_dir, _counted(receipts, encoders), index=index, mask=stored_mask):
            if isinstance(d, str):
                skipped[d] += 1
                continue
            end = d.start + d.n
            writer.add(d.part[d.start:end], None if d.mask is None else d.mask[d.start:end], d.origin)
        if plan is not None:
            writer.log.table = input_table(plan.inputs, plan.kinds, plan.config, plan.split)
        records = writer.close()
    except BaseException:
        writer.abort()
        raise
    if callable(source):
        source = source()
    meta = sft_meta(tokenizer, dtype, Path(final) if final is not None else out, writer, records=records, seed=seed,
                    val_frac=val_frac, skipped=skipped, dataset_name=dataset_name, dataset_config=dataset_config,
                    streaming=streaming, source=source, tokenizer_path=tokenizer_path, encoders=encoders)
    write_meta(str(out), meta)
    return meta
