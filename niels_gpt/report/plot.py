"""Stats as PNG figures (matplotlib, the `plot` extra; the files are listed in docs/stats.md); `plot_stats`
returns the arrays it drew: tokens per split, per source the length histogram of its splits (p50/p90/p99
marked, log-spaced bins where the lengths span a factor of 100, for SFT the share a row of T+1 tokens
cuts) and the share of tokens by length, packed bins' fill, a mixture's realised shares, and stats.json.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from niels_gpt.errors import ConfigError
from niels_gpt.report.figures import Stats, StreamStats


def _sources(stats: Stats) -> dict[str, list[tuple[str, StreamStats]]]:
    """Streams grouped by source: {source ("" for one cache): [(split, stream)]}."""
    out: dict[str, list[tuple[str, StreamStats]]] = {}
    for s in stats.streams:
        if not s.hist_counts:
            continue
        source, _, split = s.name.rpartition("/")
        out.setdefault(source, []).append((split, s))
    return out


def _file(stem: str, source: str) -> str:
    return f"{stem}_{source.replace('/', '_')}.png" if source else f"{stem}.png"


def plot_stats(stats: Stats, out_dir: str | Path) -> dict[str, dict]:
    """Write PNG figures under out_dir; returns {file name: the arrays drawn} for checking."""
    try:
        import matplotlib
    except ImportError as exc:
        raise ConfigError(f"--png {out_dir}: matplotlib is not installed; install the plot extra: "
                          "pip install 'niels_gpt[plot]' (or run without --png for text tables)") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--png {out}: exists and is not a directory; pass a directory for the PNG files")
    out.mkdir(parents=True, exist_ok=True)
    drawn: dict[str, dict] = {}

    def save(fig, name: str, arrays: dict) -> None:
        fig.tight_layout()
        fig.savefig(out / name)
        plt.close(fig)
        drawn[name] = arrays

    if stats.kind == "mixture":
        e = stats.extra
        real = np.asarray(e["realised_over_steps"])
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for i, n in enumerate(e["names"]):
            ax.plot(np.arange(1, e["steps"] + 1), real[:, i], label=n)
        ax.set(xlabel="step", ylabel="share of samples so far")
        ax.legend()
        save(fig, "mixture.png", {"names": list(e["names"]), "realised": real})

    fig, ax = plt.subplots(figsize=(6, 3.5))
    names, tokens = [s.name for s in stats.streams], [s.tokens for s in stats.streams]
    ax.bar(names, tokens)
    ax.set(ylabel="tokens", title=f"tokens per split: {Path(stats.path).name}")
    if len(names) > 4:
        ax.tick_params(axis="x", labelrotation=45)
    save(fig, "tokens.png", {"names": names, "tokens": tokens})

    def label(ax, log: bool, unit: str, ylabel: str, title: str) -> None:
        if log:
            ax.set_xscale("log")
        ax.set(xlabel=f"tokens per {unit}" + (" (log scale)" if log else ""), ylabel=ylabel, title=title)
        ax.legend(fontsize="small")

    for source, splits in _sources(stats).items():
        unit = ("sequence" if stats.kind == "packed" else
                "example" if any(s.cut_examples is not None for _, s in splits) else "document")
        log = any(s.hist_log for _, s in splits)
        name = source or Path(stats.path).name
        one = len(splits) == 1  # one split: filled steps
        cut = [(split, s) for split, s in splits if s.cut_examples is not None]
        seq_len = cut[-1][1].seq_len if cut else None
        cut_share = {split: s.cut_examples / s.documents if s.documents else 0.0 for split, s in cut}
        fig, ax = plt.subplots(figsize=(6, 3.5))
        lengths = {}
        for i, (split, s) in enumerate(splits):
            ax.stairs(s.hist_counts, s.hist_edges, label=split, color=f"C{i}", fill=one, alpha=0.8)
            for key in ("p50", "p90", "p99"):
                ax.axvline(s.lengths[key], linestyle="--", linewidth=0.7, color=f"C{i}")
            lengths[split] = {"counts": list(s.hist_counts), "edges": list(s.hist_edges), "lengths": dict(s.lengths)}
        if seq_len is not None:
            shares = ", ".join(f"{k} {v:.1%}" for k, v in cut_share.items())
            ax.axvline(seq_len + 1, color="red", linewidth=1.2, label=f"--seq-len {seq_len}: cuts {shares} of examples")
        label(ax, log, unit, f"{unit}s", f"{name}: {unit} lengths (dashed: p50, p90, p99)")
        save(fig, _file("lengths", source), {"splits": lengths, "log": log, "seq_len": seq_len,
                                              "cut_share": cut_share})

        fig, ax = plt.subplots(figsize=(6, 3.5))
        shares = {}
        for i, (split, s) in enumerate(splits):
            share = np.asarray(s.hist_tokens, dtype=np.float64) / max(sum(s.hist_tokens), 1)
            ax.stairs(share, s.hist_edges, label=split, color=f"C{i}", fill=one, alpha=0.8)
            shares[split] = {"shares": share.tolist(), "edges": list(s.hist_edges)}
        label(ax, log, unit, "share of all tokens", f"{name}: where the tokens are, by {unit} length")
        save(fig, _file("token_share", source), {"splits": shares, "log": log})

    if stats.kind == "packed":
        e = stats.extra
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.stairs(e["fill_counts"], e["fill_edges"], fill=True)
        ax.set(xlabel="bin fill (tokens / pack_size)", ylabel="bins",
               title=f"efficiency {e['efficiency']:.4f}")
        save(fig, "fill.png", {"counts": list(e["fill_counts"]), "edges": list(e["fill_edges"])})
    (out / "stats.json").write_text(json.dumps(stats.to_dict(), indent=2) + "\n")
    return drawn
