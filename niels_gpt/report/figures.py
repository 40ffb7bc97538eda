"""The figures of one token stream (tokens, documents, EOT/BOS counts, length percentiles and a histogram),
counted with vectorised numpy chunk by chunk over memmaps; `format_stats` and `table`: the plain-text tables
`inspect` and `stats` print, numbers right-aligned with thousands separators."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from niels_gpt.errors import NielsGPTError
from niels_gpt.progress import progress_bar, should_show

CHUNK = 1 << 24  # tokens per vectorised pass
HIST_BINS = 40
PERCENTILES = (50, 90, 99)
WIDE = 100  # lengths spanning this factor or more are binned on a log scale (books beside tweets)


class StatsError(NielsGPTError):
    """PATH is not something stats can describe."""


@dataclass
class StreamStats:
    """One split (or one token stream) of an output."""

    name: str
    tokens: int
    documents: int | None
    eot: int | None
    bos: int | None
    lengths: dict = field(default_factory=dict)  # p50/p90/p99/max/mean of document lengths
    hist_counts: list = field(default_factory=list)
    hist_edges: list = field(default_factory=list)
    hist_tokens: list = field(default_factory=list)  # tokens of the documents in each bin
    hist_log: bool = False  # log-spaced bins (the lengths span WIDE or more)
    cut_examples: int | None = None  # SFT: examples longer than seq_len + 1 tokens (a row crops them)
    trained_tokens: int | None = None  # SFT: tokens inside the assistant mask
    trained_fraction: float | None = None
    seq_len: int | None = None
    lose_all_trained: int | None = None  # SFT: examples with no trained target in their first seq_len targets


@dataclass
class Stats:
    path: str
    kind: str  # pretrain, sft, packed, or a foreign format's name
    streams: list[StreamStats]
    extra: dict = field(default_factory=dict)  # packed: pack_size, efficiency, fill histogram

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.streams)

    def to_dict(self) -> dict:
        return {"path": self.path, "kind": self.kind, "tokens": self.tokens,
                "streams": [asdict(s) for s in self.streams], **self.extra}


def length_figures(lengths: np.ndarray) -> tuple[dict, dict]:
    """(percentiles, mean, min, max; the histogram as StreamStats fields, log-spaced bins where the lengths
    span a factor of WIDE, and the tokens each bin's documents hold)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size == 0:
        return {}, {}
    pct = np.percentile(lengths, PERCENTILES)
    figures = {f"p{p}": float(v) for p, v in zip(PERCENTILES, pct, strict=True)}
    lo, hi = int(lengths.min()), int(lengths.max())
    figures.update(max=hi, min=lo, mean=float(lengths.mean()))
    log = lo > 0 and hi / lo >= WIDE
    bins = np.geomspace(lo, hi + 1, HIST_BINS + 1) if log else min(HIST_BINS, max(1, hi - lo + 1))
    counts, edges = np.histogram(lengths, bins=bins)
    tokens, _ = np.histogram(lengths, bins=edges, weights=lengths)
    return figures, {"hist_counts": counts.tolist(), "hist_edges": edges.tolist(),
                     "hist_tokens": tokens.astype(np.int64).tolist(), "hist_log": bool(log)}


def _scan(arrays: list[np.ndarray], sep_id: int | None, other_id: int | None, desc: str,
          progress: bool | None) -> tuple[int, np.ndarray, int | None]:
    """(tokens, separator positions over the concatenated arrays, the count of other_id)."""
    total = sum(len(a) for a in arrays)
    positions, other, base = [], 0, 0
    with progress_bar(total=total, unit="tok", unit_scale=True, desc=desc,
                      progress=should_show(progress)) as bar:
        for arr in arrays:
            for s in range(0, len(arr), CHUNK):
                chunk = np.asarray(arr[s:s + CHUNK])
                if sep_id is not None:
                    positions.append(np.flatnonzero(chunk == sep_id) + (base + s))
                if other_id is not None and other_id != sep_id:
                    other += int(np.count_nonzero(chunk == other_id))
                bar.update(len(chunk))
            base += len(arr)
    pos = np.concatenate(positions) if positions else np.zeros(0, np.int64)
    return total, pos, None if other_id is None else len(pos) if other_id == sep_id else other


def stream_stats(name: str, arrays: list[np.ndarray], *, eot_id: int | None, bos_id: int | None,
                 separator: str = "eot", progress: bool | None = None) -> StreamStats:
    """Figures of one token stream made of `arrays` end to end: documents end at each EOT, or start at each
    BOS (separator="bos")."""
    sep_id, other_id = (eot_id, bos_id) if separator == "eot" else (bos_id, eot_id)
    total, pos, n_other = _scan(arrays, sep_id, other_id, f"stats {name}", progress)
    n_sep = None if sep_id is None else len(pos)
    n_eot, n_bos = (n_sep, n_other) if separator == "eot" else (n_other, n_sep)
    docs, figures, hist = None, {}, {}
    if sep_id is not None:
        bounds = np.diff(np.concatenate([[0], pos if separator == "bos" else pos + 1, [total]]))
        lengths = bounds[bounds > 0]
        docs = len(lengths)
        figures, hist = length_figures(lengths)
    return StreamStats(name=name, tokens=total, documents=docs, eot=n_eot, bos=n_bos, lengths=figures, **hist)


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.1f}" if v >= 10 or v == int(v) else f"{v:.3f}"
    return f"{v:,}"


def table(header: list[str], rows: list[list]) -> str:
    cells = [header] + [[_fmt(c) if not isinstance(c, str) else c for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_stats(stats: Stats) -> str:
    e = stats.extra
    if stats.kind == "mixture":
        rows = [[n, s.tokens, f"{e['realised'][n]:.4f}", f"{e['target'][n]:.4f}"]
                for n, s in zip(e["names"], stats.streams, strict=True)]
        head = f"mixture {stats.path}: {e['steps']:,} steps of {e['global_batch_size']} samples"
        return "\n".join([head, "", table(["dataset", "samples", "realised", "weight now"], rows)])
    rows = [[s.name, s.tokens, s.documents, s.eot, s.bos, s.lengths.get("p50"), s.lengths.get("p90"),
             s.lengths.get("p99"), s.lengths.get("max")] for s in stats.streams]
    unit = "sequences" if stats.kind == "packed" else "examples" if stats.kind == "sft" else "documents"
    out = [f"{stats.kind} {stats.path}: {stats.tokens:,} tokens", "",
           table(["split", "tokens", unit, "EOT", "BOS", "p50", "p90", "p99", "max"], rows)]
    trained = [s for s in stats.streams if s.trained_tokens is not None]
    if trained:
        lose = any(s.lose_all_trained is not None for s in trained)
        T = trained[0].seq_len
        head = ["split", "trained tokens", "fraction"] + ([f"no trained token at T={T}", f"cut at T={T}"]
                                                          if lose else [])
        rows = [[s.name, s.trained_tokens, s.trained_fraction]
                + ([s.lose_all_trained, f"{s.cut_examples} ({s.cut_examples / max(s.documents, 1):.1%})"] if lose else [])
                for s in trained]
        out += ["", table(head, rows)]
    if stats.kind == "packed":
        out += ["", f"bins: {e['bins']:,} of {e['pack_size']:,} tokens; efficiency {e['efficiency']:.4f}; "
                f"mean sequences per bin {e['sequences_per_bin_mean']:.2f}"]
        if "val" in e:
            out.append(f"val (val/): {e['val']['bins']:,} bins; efficiency {e['val']['efficiency']:.4f}")
        out += ["", table(["fill", "bins"], [[f"{lo:.2f}-{hi:.2f}", c] for lo, hi, c in
                                             zip(e["fill_edges"][:-1], e["fill_edges"][1:], e["fill_counts"],
                                                 strict=True)])]
    return "\n".join(out)
