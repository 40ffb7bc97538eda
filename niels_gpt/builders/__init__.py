"""Every builder: one `build` verb over one plan (run.py), the one-process builders (pretrain.py, sft.py),
the parallel path (tasks.py, commit.py, executors.py, parallel.py), the tokenizer step (tokenizer.py) and
build-all as a recipe over `build` (build_all.py). docs/scale.md has the plan for 100B tokens.

    niels-gpt-data build corpus/ --out cache/pretrain/mine --tokenizer cache/tokenizer --executor ray
"""

import importlib

__all__ = ["BuildSpec", "build", "format_summary", "make_plan"]
_HOME = {"make_plan": "plan", "build": "run", "BuildSpec": "run", "format_summary": "run"}


def __getattr__(name: str):
    # NOTE: lazy, so that a worker importing niels_gpt.builders.tasks does not import the driver's
    # modules (the builders import torch: ~1.5 s per Ray worker).
    if name in _HOME:
        return getattr(importlib.import_module(f"niels_gpt.builders.{_HOME[name]}"), name)
    raise AttributeError(f"module 'niels_gpt.builders' has no attribute {name!r}")
