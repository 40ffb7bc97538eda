"""Look at an output: `inspect` describes it, `verify` checks it, `stats` counts it (docs/stats.md).

Each reads what niels_gpt.locate found through the readers training uses. `found`: the outputs below a path
and a cache's tokenizer; `counts`/`figures`: the figures (vectorised numpy over memmaps, chunk by chunk);
`mixture`: a mixture's realised proportions; `render`: text tables; `plot`: PNG figures (the `plot` extra).
"""

from niels_gpt.report.counts import cache_stats
from niels_gpt.report.inspection import inspect_json, inspect_path, show_tokens
from niels_gpt.report.mixture import mixture_stats
from niels_gpt.report.plot import plot_stats
from niels_gpt.report.render import format_stats
from niels_gpt.report.verify import verify_outputs, verify_path

__all__ = ["cache_stats", "format_stats", "inspect_json", "inspect_path", "mixture_stats", "plot_stats",
           "show_tokens", "verify_outputs", "verify_path"]
