"""Look at an output: `inspect` describes it, `verify` checks it, `stats` counts it (docs/stats.md).

Each reads what niels_gpt.locate found through the readers training uses. `found`: the outputs below a path
and a cache's tokenizer; `counts`/`figures`: the figures (vectorised numpy over memmaps, chunk by chunk) and
their text tables; `mixture`: a mixture's realised proportions; `plot`: PNG figures (the `plot` extra).
"""

from niels_gpt.lazy import lazy_names

# NOTE: the names below are imported on first use (PEP 562): `mixture_stats` draws as the mixture sampler does,
# with torch (~1 s to import); `inspect`, `verify` and `stats` of a cache or packed bins run without it.
_HOMES = {
    "cache_stats": "counts", "inspect_json": "inspection", "inspect_path": "inspection", "show_tokens": "inspection",
    "mixture_stats": "mixture", "plot_stats": "plot", "format_stats": "figures", "verify_outputs": "verify",
    "verify_path": "verify",
}
__all__ = sorted(_HOMES)
__getattr__, __dir__ = lazy_names(globals(), _HOMES)
