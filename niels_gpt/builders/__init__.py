"""Building caches past one process: a plan of tasks, executors (in-process, local processes, Ray), a commit.

    niels-gpt-data dist-build corpus/ --out cache/pretrain/mine --tokenizer cache/tokenizer --executor ray

The plan (plan.py) cuts the inputs into ordered tasks with stable ids; each task (tasks.py) tokenizes
its documents into part files and a receipt; the commit (commit.py) turns the parts, in plan order,
into the shards and meta.json exactly as `build_pretrain_cache` writes them; executors.py runs the
tasks; dist.py drives it all and resumes from receipts. docs/scale.md has the plan for 100B tokens.
"""

import importlib

__all__ = ["Plan", "Task", "dist_build", "format_summary", "make_plan", "plan_documents"]
_HOME = {"Plan": "plan", "Task": "plan", "make_plan": "plan", "plan_documents": "plan",
         "dist_build": "dist", "format_summary": "dist"}


def __getattr__(name: str):
    # NOTE: lazy, so that a worker importing niels_gpt.builders.tasks does not import the driver's
    # modules (the commit imports cache.build_cache, and with it torch: ~1.5 s per Ray worker).
    if name in _HOME:
        return getattr(importlib.import_module(f"niels_gpt.builders.{_HOME[name]}"), name)
    raise AttributeError(f"module 'niels_gpt.builders' has no attribute {name!r}")
