"""Stats as text tables (`format_stats`) and as PNG figures (`plot_stats`, matplotlib from the `plot`
extra), each returning what it drew so tests can check the arrays."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from niels_gpt.errors import ConfigError
from niels_gpt.stats.figures import Stats
from niels_gpt.tables import table


def format_stats(stats: Stats) -> str:
    out = [f"{stats.kind} {stats.path}: {stats.tokens:,} tokens"]
    rows = [[s.name, s.tokens, s.documents, s.eot, s.bos, s.lengths.get("p50"), s.lengths.get("p90"),
             s.lengths.get("p99"), s.lengths.get("max")] for s in stats.streams]
    unit = "sequences" if stats.kind == "packed" else "examples" if stats.kind == "sft" else "documents"
    out += ["", table(["split", "tokens", unit, "EOT", "BOS", "p50", "p90", "p99", "max"], rows)]
    trained = [s for s in stats.streams if s.trained_tokens is not None]
    if trained:
        lose = any(s.lose_all_trained is not None for s in trained)
        head = ["split", "trained tokens", "fraction"] + ([f"no trained token at T={trained[0].seq_len}"] if lose else [])
        rows = [[s.name, s.trained_tokens, s.trained_fraction] + ([s.lose_all_trained] if lose else []) for s in trained]
        out += ["", table(head, rows)]
    if stats.kind == "mixture":
        e = stats.extra
        out = [f"mixture {stats.path}: {e['steps']:,} steps of {e['global_batch_size']} samples", "",
               table(["dataset", "samples", "realised", "weight now"],
                     [[n, s.tokens, f"{e['realised'][n]:.4f}", f"{e['target'][n]:.4f}"]
                      for n, s in zip(e["names"], stats.streams, strict=True)])]
        return "\n".join(out)
    if stats.kind == "packed":
        e = stats.extra
        out += ["", f"bins: {e['bins']:,} of {e['pack_size']:,} tokens; efficiency {e['efficiency']:.4f}; "
                f"mean sequences per bin {e['sequences_per_bin_mean']:.2f}", "",
                table(["fill", "bins"], [[f"{lo:.2f}-{hi:.2f}", c] for lo, hi, c in
                                         zip(e["fill_edges"][:-1], e["fill_edges"][1:], e["fill_counts"], strict=True)])]
    return "\n".join(out)


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

    if stats.kind == "mixture":
        e = stats.extra
        real = np.asarray(e["realised_over_steps"])
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for i, n in enumerate(e["names"]):
            ax.plot(np.arange(1, e["steps"] + 1), real[:, i], label=n)
        ax.set_xlabel("step")
        ax.set_ylabel("share of samples so far")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "mixture.png")
        plt.close(fig)
        drawn["mixture.png"] = {"names": list(e["names"]), "realised": real}

    fig, ax = plt.subplots(figsize=(6, 3.5))
    names, tokens = [s.name for s in stats.streams], [s.tokens for s in stats.streams]
    ax.bar(names, tokens)
    ax.set_ylabel("tokens")
    ax.set_title(f"tokens per split: {Path(stats.path).name}")
    fig.tight_layout()
    fig.savefig(out / "tokens.png")
    plt.close(fig)
    drawn["tokens.png"] = {"names": names, "tokens": tokens}

    for s in stats.streams:
        if not s.hist_counts:
            continue
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.stairs(s.hist_counts, s.hist_edges, fill=True)
        for key in ("p50", "p90", "p99"):
            ax.axvline(s.lengths[key], linestyle="--", linewidth=0.8, color="k")
        ax.set_xlabel("tokens per " + ("sequence" if stats.kind == "packed" else "document"))
        ax.set_ylabel("count")
        ax.set_title(f"{s.name}: p50 {s.lengths['p50']:.0f}, p90 {s.lengths['p90']:.0f}, "
                     f"p99 {s.lengths['p99']:.0f}, max {s.lengths['max']}")
        fig.tight_layout()
        name = f"lengths_{s.name.replace('/', '_')}.png"
        fig.savefig(out / name)
        plt.close(fig)
        drawn[name] = {"counts": list(s.hist_counts), "edges": list(s.hist_edges), "lengths": dict(s.lengths)}

    if stats.kind == "packed":
        e = stats.extra
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.stairs(e["fill_counts"], e["fill_edges"], fill=True)
        ax.set_xlabel("bin fill (tokens / pack_size)")
        ax.set_ylabel("bins")
        ax.set_title(f"efficiency {e['efficiency']:.4f}")
        fig.tight_layout()
        fig.savefig(out / "fill.png")
        plt.close(fig)
        drawn["fill.png"] = {"counts": list(e["fill_counts"]), "edges": list(e["fill_edges"])}
    (out / "stats.json").write_text(json.dumps(stats.to_dict(), indent=2) + "\n")
    return drawn
