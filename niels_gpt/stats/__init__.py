"""stats: figures about what a cache, packed directory or converted output holds.

`cache_stats(path)` reads the token files as memmaps and counts with vectorised numpy, chunk by chunk
(a progress bar on stderr when it is a terminal): tokens, documents (runs closed by the document
separator), document-length percentiles and a histogram, EOT/BOS counts, per split; for SFT caches the
trained-token fraction (the assistant mask) and how many examples keep no trained target at a sequence
length T; for packed bins the efficiency and the fill histogram. `format_stats` renders text tables,
`plot_stats` writes PNG files (matplotlib, the `plot` extra) and returns the arrays it drew.

`figures` counts one token stream, `outputs` knows each kind of output, `mixture` draws a mixture's
proportions, `render` writes the tables, `plot` the figures.
"""

from niels_gpt.stats.figures import (
    CHUNK,
    HIST_BINS,
    PERCENTILES,
    Stats,
    StatsError,
    StreamStats,
    stream_stats,
)
from niels_gpt.stats.mixture import mixture_stats
from niels_gpt.stats.outputs import cache_stats, lose_all_trained, span_mask
from niels_gpt.stats.plot import plot_stats
from niels_gpt.stats.render import format_stats

__all__ = ["CHUNK", "HIST_BINS", "PERCENTILES", "Stats", "StatsError", "StreamStats", "cache_stats", "format_stats",
    "lose_all_trained", "mixture_stats", "plot_stats", "span_mask", "stream_stats"]
