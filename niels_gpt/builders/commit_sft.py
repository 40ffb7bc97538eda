"""The SFT commit: the rendered parts of a chat build's tasks, in plan order, through the one-process
builder's `SFTWriter`, so the draws, files and meta.json are the same. Parts are checked against receipts.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from niels_gpt.builders.commit import _counted, load_part, skip_reason
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
    names = ("bin", "mask", "lens") if stored_mask else ("bin", "lens")
    try:
        for receipt in _counted(receipts, encoders):
            arrays = load_part(work_dir, receipt, names + (("origins",) if index is not None else ()))
            rows = iter([index.row(receipt["task"]["pieces"], o) for o in arrays.pop().tolist()]) if index else None
            tokens, lens = arrays[0], arrays[-1]
            mask = arrays[1] if stored_mask else None
            start = 0
            for n in lens.tolist():
                if n <= 0:
                    skipped[skip_reason(receipt, n)] += 1
                    continue
                writer.add(tokens[start:start + n], None if mask is None else mask[start:start + n],
                           None if rows is None else next(rows))
                start += n
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
