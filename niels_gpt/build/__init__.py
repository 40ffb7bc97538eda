"""Building caches past one process: a plan of tasks, executors (in-process, local processes, Ray), a commit.

    niels-gpt-data dist-build corpus/ --out cache/pretrain/mine --tokenizer cache/tokenizer --executor ray

The plan (plan.py) cuts the inputs into ordered tasks with stable ids; each task (tasks.py) tokenizes
its documents into part files and a receipt; the commit (commit.py) turns the parts, in plan order,
into the shards and meta.json exactly as `build_pretrain_cache` writes them; executors.py runs the
tasks; dist.py drives it all and resumes from receipts. docs/scale.md has the plan for 100B tokens.
"""

from niels_gpt.build.dist import dist_build, format_summary
from niels_gpt.build.plan import Plan, Task, make_plan, plan_documents

__all__ = ["Plan", "Task", "dist_build", "format_summary", "make_plan", "plan_documents"]
