"""Plain-text tables as `inspect` and `stats` print them: numbers right-aligned with thousands separators."""

from __future__ import annotations

from niels_gpt.report.figures import Stats


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
