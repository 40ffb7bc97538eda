"""`dist_build`: the Python form of the old `dist-build` (kept for one release); `build` does it all now.

    summary = dist_build(["corpus/"], "cache/pretrain/mine", tokenizer="cache/tokenizer",
                         max_train_tokens=10**9, max_val_tokens=5_000_000, executor="processes", workers=8)

Arguments map onto `BuildSpec` (builders/run.py): max_train_tokens -> max_tokens, max_val_tokens -> val_tokens,
hf={"path", "name", "split", "data_files"} -> the dataset id (or its files) as sources, executor "inprocess"
-> the task path in this process (no pool).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from niels_gpt.builders.executors import RAY_ADDRESS, RETRIES
from niels_gpt.builders.run import BuildSpec, build, format_summary  # noqa: F401  (format_summary: the old name)
from niels_gpt.errors import ConfigError


def dist_build(inputs: Sequence[str | os.PathLike], out_dir: str | os.PathLike, *, tokenizer,
               max_train_tokens: int, max_val_tokens: int, shard_bytes: int, seed: int,
               executor: str = "processes", workers: int | None = None, ray_address: str = RAY_ADDRESS,
               retries: int = RETRIES, task_bytes: int | None = None, text_field: str = "text",
               hf: dict | None = None, dataset_name: str | None = None, shuffle_buffer: int | None = None,
               work_dir: str | os.PathLike | None = None, keep_parts: bool = False,
               progress: bool | None = False, log=None, eos: int | str | None = None,
               bos: int | str | None = None, separator: str | None = None) -> dict:
    """Build a pretraining cache from `inputs` on `executor`; returns the summary."""
    sources, config, split = list(inputs), None, "train"
    if hf is not None:
        if sources:
            raise ConfigError("pass either input files or --hf-dataset, not both")
        files = hf.get("data_files")
        sources = ([files] if isinstance(files, str) else list(files)) if files else [hf["path"]]
        config, split = (None, "train") if files else (hf.get("name"), hf.get("split") or "train")
    spec = BuildSpec(sources=sources, out=os.fspath(out_dir), tokenizer=tokenizer, eos=eos, bos=bos,
                     separator=separator, text_field=text_field, hf_config=config, split=split,
                     max_tokens=max_train_tokens, val_tokens=max_val_tokens, shard_bytes=shard_bytes, seed=seed,
                     shuffle_buffer=shuffle_buffer, executor=executor, workers=workers, ray_address=ray_address,
                     retries=retries, task_bytes=task_bytes, name=dataset_name,
                     work_dir=None if work_dir is None else os.fspath(work_dir), keep_parts=keep_parts,
                     progress=progress)
    return build(spec, log)
