"""Look at an output: `inspect` describes it, `verify` checks it, `stats` counts it.

One package for the three, since each is a report on an output that niels_gpt.locate found, read through
the readers training uses (the name `report` covers all three; `stats` would name only the counting).

- `found`: the outputs at or below a path (caches, unfinished and interrupted builds) and a cache's tokenizer.
- `verify`: each output against its own record and its readers. `inspection`: describe one, decode a window.
- `counts`: `cache_stats(path)`, the figures of each kind of output; `figures` counts one token stream as
  memmaps with vectorised numpy, chunk by chunk (a progress bar on stderr when it is a terminal): tokens,
  documents, length percentiles and a histogram, EOT/BOS counts; for SFT caches the trained fraction and the
  examples that keep no trained target at T; for packed bins the efficiency and the fill histogram.
- `mixture`: a mixture's realised proportions. `render`: text tables. `plot`: PNG figures (the `plot` extra).
"""

from niels_gpt.report.counts import cache_stats, lose_all_trained, span_mask
from niels_gpt.report.figures import (
    CHUNK,
    HIST_BINS,
    PERCENTILES,
    Stats,
    StatsError,
    StreamStats,
    stream_stats,
)
from niels_gpt.report.found import find_caches, find_tokenizer, unfinished_dirs
from niels_gpt.report.inspection import (
    TRAINED_CLOSE,
    TRAINED_OPEN,
    inspect_json,
    inspect_path,
    show_tokens,
    totals_table,
)
from niels_gpt.report.mixture import mixture_stats
from niels_gpt.report.plot import plot_stats
from niels_gpt.report.render import format_stats
from niels_gpt.report.verify import verify_outputs, verify_path

__all__ = ["CHUNK", "HIST_BINS", "PERCENTILES", "Stats", "StatsError", "StreamStats", "TRAINED_CLOSE",
           "TRAINED_OPEN", "cache_stats", "find_caches", "find_tokenizer", "format_stats", "inspect_json",
           "inspect_path", "lose_all_trained", "mixture_stats", "plot_stats", "show_tokens", "span_mask",
           "stream_stats", "totals_table", "unfinished_dirs", "verify_outputs", "verify_path"]
