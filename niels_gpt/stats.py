"""stats: figures about what a cache, packed directory or converted output holds.

`cache_stats(path)` reads the token files as memmaps and counts with vectorised numpy, chunk by chunk
(a progress bar on stderr when it is a terminal): tokens, documents (runs closed by the document
separator), document-length percentiles and a histogram, EOT/BOS counts, per split; for SFT caches the
trained-token fraction (the assistant mask) and how many examples keep no trained target at a sequence
length T; for packed bins the efficiency and the fill histogram. `format_stats` renders text tables,
`plot_stats` writes PNG files (matplotlib, the `plot` extra) and returns the arrays it drew.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from niels_gpt.errors import ConfigError, NielsGPTError
from niels_gpt.loading.mixture import MixtureConfig, normalised, quota_step
from niels_gpt.meta import META_NAME, read_meta
from niels_gpt.packing.factory import open_packed
from niels_gpt.packing.masks import assistant_token_mask
from niels_gpt.packing.memmap_format import read_manifest
from niels_gpt.packing.parquet import PARQUET_SUFFIXES
from niels_gpt.progress import should_show
from niels_gpt.readers.shards import shard_array
from niels_gpt.report import PACKED_MANIFEST, find_caches, foreign_output, megatron_prefix
from niels_gpt.tables import table

CHUNK = 1 << 24  # tokens per vectorised pass
HIST_BINS = 40
PERCENTILES = (50, 90, 99)


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


def _bar(total: int, desc: str, progress: bool | None):
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="tok", unit_scale=True, desc=desc, disable=not should_show(progress),
                file=sys.stderr)


def _length_figures(lengths: np.ndarray) -> tuple[dict, list, list]:
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size == 0:
        return {}, [], []
    pct = np.percentile(lengths, PERCENTILES)
    figures = {f"p{p}": float(v) for p, v in zip(PERCENTILES, pct, strict=True)}
    figures.update(max=int(lengths.max()), min=int(lengths.min()), mean=float(lengths.mean()))
    counts, edges = np.histogram(lengths, bins=min(HIST_BINS, max(1, int(lengths.max() - lengths.min()) + 1)))
    return figures, counts.tolist(), edges.tolist()


def _scan(arrays: list[np.ndarray], sep_id: int | None, bos_id: int | None, desc: str,
          progress: bool | None) -> tuple[int, np.ndarray, int | None, int | None]:
    """(tokens, separator positions over the concatenated arrays, separator count, BOS count)."""
    total = sum(len(a) for a in arrays)
    positions, bos = [], 0
    with _bar(total, desc, progress) as bar:
        base = 0
        for arr in arrays:
            for s in range(0, len(arr), CHUNK):
                chunk = np.asarray(arr[s:s + CHUNK])
                if sep_id is not None:
                    positions.append(np.flatnonzero(chunk == sep_id) + (base + s))
                if bos_id is not None and bos_id != sep_id:
                    bos += int(np.count_nonzero(chunk == bos_id))
                bar.update(len(chunk))
            base += len(arr)
    pos = np.concatenate(positions) if positions else np.zeros(0, np.int64)
    n_sep = None if sep_id is None else len(pos)
    n_bos = None if bos_id is None else (n_sep if bos_id == sep_id else bos)
    return total, pos, n_sep, n_bos


def _doc_lengths(total: int, pos: np.ndarray, before: bool) -> np.ndarray:
    """Document lengths from separator positions: a separator closes (after) or opens (before) a document."""
    if before:
        bounds = np.concatenate([[0], pos, [total]])
    else:
        bounds = np.concatenate([[0], pos + 1, [total]])
    lengths = np.diff(bounds)
    return lengths[lengths > 0]


def stream_stats(name: str, arrays: list[np.ndarray], *, eot_id: int | None, bos_id: int | None,
                 separator: str = "eot", position: str = "after", progress: bool | None = None) -> StreamStats:
    """Figures of one token stream made of `arrays` end to end, documents split at the separator."""
    sep_id = eot_id if separator == "eot" else bos_id
    total, pos, n_sep, n_bos = _scan(arrays, sep_id, bos_id, f"stats {name}", progress)
    if separator == "eot":
        n_eot = n_sep
    else:
        n_eot = None if eot_id is None else sum(int(np.count_nonzero(np.asarray(a) == eot_id)) for a in arrays)
    docs, figures, counts, edges = None, {}, [], []
    if sep_id is not None:
        lengths = _doc_lengths(total, pos, before="before" in position)
        docs = len(lengths)
        figures, counts, edges = _length_figures(lengths)
    return StreamStats(name=name, tokens=total, documents=docs, eot=n_eot, bos=n_bos, lengths=figures,
                       hist_counts=counts, hist_edges=edges)


def _bos_id(meta: dict) -> int | None:
    tok = meta.get("tokenizer") or {}
    for value in (tok.get("bos_id"), (meta.get("special_token_ids") or {}).get("bos")):
        if isinstance(value, int) and value >= 0:
            return value
    return None


def _dtype(meta: dict) -> np.dtype:
    return np.dtype("<u4" if str(meta.get("token_dtype", "uint16-le")).startswith("uint32") else "<u2")


def _pretrain(cache: Path, meta: dict, splits: list[str], progress) -> Stats:
    dtype = _dtype(meta)
    sep = meta.get("document_separator") or {}
    separator = "bos" if sep.get("token") == "bos" else "eot"
    position = str(sep.get("position", "after"))
    eot_id = (meta.get("special_token_ids") or {}).get("eot")
    streams = []
    for split in splits:
        rels = sorted(r for r in meta["files"] if r.startswith(f"{split}/") and r.endswith((".bin", ".bin.zst")))
        arrays = [shard_array(cache / r, meta, meta["files"][r], dtype) for r in rels]  # .bin.zst: compressed
        streams.append(stream_stats(split, arrays, eot_id=eot_id, bos_id=_bos_id(meta), separator=separator,
                                    position=position, progress=progress))
    return Stats(str(cache), "pretrain", streams, {"dataset_name": meta.get("dataset_name")})


def span_mask(tokens: np.ndarray, starts: np.ndarray, asst_id: int, eot_id: int) -> np.ndarray:
    """The assistant mask over a whole SFT token file (state reset at every example start): the packing
    module's span rule, the one the SFT dataset and pack-sft train on."""
    return assistant_token_mask(tokens, asst_id, eot_id, seq_starts=starts)


def lose_all_trained(mask: np.ndarray, starts: np.ndarray, seq_len: int) -> int:
    """Examples whose trained targets all lie past position seq_len (a window holds seq_len+1 tokens)."""
    n = len(mask)
    ends = np.append(starts[1:], n)
    trained_pos = np.flatnonzero(mask)
    # first trained position at or after each start; it must be < end and <= start + seq_len
    first = np.searchsorted(trained_pos, starts + 1)
    first_pos = np.where(first < len(trained_pos), trained_pos[np.minimum(first, len(trained_pos) - 1)], n)
    keeps = (first_pos < ends) & (first_pos <= starts + seq_len)
    return int(np.count_nonzero(~keeps))


def _sft(cache: Path, meta: dict, splits: list[str], seq_len: int, progress) -> Stats:
    dtype = _dtype(meta)
    specials = meta.get("special_token_ids") or {}
    eot_id, asst_id = specials.get("eot"), specials.get("asst")
    streams = []
    for split in splits:
        tok_path, idx_path = cache / f"{split}_tokens.bin", cache / f"{split}_idx.npy"
        if f"{split}_tokens.bin" not in meta["files"]:
            continue
        tokens = np.memmap(tok_path, dtype=dtype, mode="r") if tok_path.stat().st_size else np.zeros(0, dtype)
        starts = np.load(idx_path, allow_pickle=False).astype(np.int64)
        with _bar(len(tokens), f"stats {split}", progress) as bar:
            arr = np.asarray(tokens)
            lengths = np.diff(np.append(starts, len(arr)))
            n_eot = None if eot_id is None else int(np.count_nonzero(arr == eot_id))
            bos_id = _bos_id(meta)
            n_bos = None if bos_id is None else int(np.count_nonzero(arr == bos_id))
            mask_name = f"{split}_mask.bin"
            if mask_name in meta["files"]:
                mask = np.fromfile(cache / mask_name, dtype=np.uint8).astype(bool)
            elif asst_id is not None and eot_id is not None:
                mask = span_mask(arr, starts, asst_id, eot_id)
            else:
                mask = None
            bar.update(len(arr))
        figures, counts, edges = _length_figures(lengths)
        s = StreamStats(name=split, tokens=len(arr), documents=len(starts), eot=n_eot, bos=n_bos, lengths=figures,
                        hist_counts=counts, hist_edges=edges, seq_len=seq_len)
        if mask is not None:
            s.trained_tokens = int(np.count_nonzero(mask))
            s.trained_fraction = s.trained_tokens / len(arr) if len(arr) else 0.0
            s.lose_all_trained = lose_all_trained(mask, starts, seq_len) if len(starts) else 0
        streams.append(s)
    return Stats(str(cache), "sft", streams, {"dataset_name": meta.get("dataset_name")})


def _packed(root: Path) -> Stats:
    manifest = read_manifest(root)
    pack_size = int(manifest["pack_size"])
    files = manifest["files"]
    packed_len = np.load(root / files["packed_len"]["name"], mmap_mode="r").astype(np.int64)
    offsets = np.load(root / files["seq_offsets"]["name"], mmap_mode="r").astype(np.int64)
    starts = np.load(root / files["seq_starts"]["name"], mmap_mode="r").astype(np.int64)
    loss_mask = np.load(root / files["loss_mask"]["name"], mmap_mode="r")
    nb = len(packed_len)
    per_bin = np.diff(offsets)
    bin_of = np.repeat(np.arange(nb), per_bin)
    nxt = np.append(starts[1:], 0)
    last = np.arange(len(starts)) == (offsets[bin_of + 1] - 1) if len(starts) else np.zeros(0, bool)
    seq_lengths = np.where(last, packed_len[bin_of] if len(starts) else 0, nxt) - starts
    trained = int(np.count_nonzero(np.asarray(loss_mask)))
    return _bins_stats(root, packed_len, seq_lengths, per_bin, trained, pack_size)


def _packed_parquet(root: Path) -> Stats:
    """Figures of packed bins in the Megatron-Bridge Parquet layout (a file or a directory of them).
    Rows carry no pack size: bins are measured against the longest one."""
    ds = open_packed(root)
    packed_len, seq_lengths, per_bin, trained = [], [], [], 0
    for i in range(len(ds)):
        item = ds[i]
        bounds = np.asarray(item["seq_boundaries"], dtype=np.int64)
        packed_len.append(len(item["input_ids"]))
        seq_lengths.append(np.diff(bounds))
        per_bin.append(len(bounds) - 1)
        trained += int(np.count_nonzero(item["loss_mask"]))
    packed_len = np.asarray(packed_len, dtype=np.int64)
    lengths = np.concatenate(seq_lengths) if seq_lengths else np.zeros(0, np.int64)
    pack_size = int(packed_len.max()) if len(packed_len) else 0
    out = _bins_stats(root, packed_len, lengths, np.asarray(per_bin, dtype=np.int64), trained, pack_size)
    out.extra["pack_size_from"] = "the longest bin (Parquet rows do not record the pack size)"
    return out


def _bins_stats(root: Path, packed_len: np.ndarray, seq_lengths: np.ndarray, per_bin: np.ndarray, trained: int,
                pack_size: int) -> Stats:
    nb = len(packed_len)
    fill = packed_len / pack_size if nb and pack_size else np.zeros(0)
    counts, edges = np.histogram(fill, bins=20, range=(0.0, 1.0))
    figures, hc, he = _length_figures(seq_lengths)
    tokens = int(packed_len.sum())
    stream = StreamStats(name="bins", tokens=tokens, documents=len(seq_lengths), eot=None, bos=None, lengths=figures,
                         hist_counts=hc, hist_edges=he, trained_tokens=trained,
                         trained_fraction=trained / tokens if tokens else 0.0)
    extra = {"pack_size": pack_size, "bins": nb, "efficiency": tokens / (nb * pack_size) if nb and pack_size else 1.0,
             "fill_counts": counts.tolist(), "fill_edges": edges.tolist(),
             "fill_mean": float(fill.mean()) if nb else 0.0, "sequences_per_bin_mean": float(per_bin.mean()) if nb else 0.0}
    return Stats(str(root), "packed", [stream], extra)


def _foreign(root: Path, info, progress) -> Stats:
    streams = []
    for name, leaf in (info.splits.items() if info.splits else [("all", info)]):
        arrays = [tf.open() for tf in leaf.token_files if tf.count]
        eot, bos = leaf.eot_id, leaf.bos_id
        separator = "eot" if eot is not None else "bos"
        streams.append(stream_stats(name, arrays, eot_id=eot, bos_id=bos, separator=separator,
                                    position="after" if separator == "eot" else "before", progress=progress))
    return Stats(str(root), info.format, streams, {})


def mixture_stats(path: str | Path, *, steps: int = 1000, global_batch_size: int = 64) -> Stats:
    """Realised proportions of a mixture config over `steps` steps of `global_batch_size` samples.

    The per-step counts are those MixtureSampler draws (the same quota rule, phases and temperature);
    the datasets themselves are not opened."""
    for name, v in (("--steps", steps), ("--batch", global_batch_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{path}: {name} must be a positive integer, got {v!r}")
    cfg = MixtureConfig.from_file(path)
    names = list(cfg.datasets)
    phases = sorted((int(ph.start_step), normalised([float(ph.weights.get(n, 0.0)) for n in names], cfg.temperature))
                    for ph in cfg.phases)
    counts = np.zeros((steps, len(names)), dtype=np.int64)
    carry = [0.0] * len(names)
    for step in range(steps):
        probs = [p for start, p in phases if start <= step][-1]
        row, carry = quota_step(probs, carry, global_batch_size)
        counts[step] = row
    cum = np.cumsum(counts, axis=0)
    realised = cum / cum.sum(axis=1, keepdims=True)
    final = [p for start, p in phases if start <= steps - 1][-1]
    streams = [StreamStats(name=n, tokens=int(cum[-1, i]), documents=None, eot=None, bos=None)
               for i, n in enumerate(names)]
    extra = {"steps": steps, "global_batch_size": global_batch_size, "names": names,
             "target": {n: final[i] for i, n in enumerate(names)},
             "realised": {n: float(realised[-1, i]) for i, n in enumerate(names)},
             "realised_over_steps": realised.tolist(), "phases": [[s, p] for s, p in phases]}
    return Stats(str(path), "mixture", streams, extra)


def cache_stats(path: str | Path, *, seq_len: int = 1024, progress: bool | None = None) -> Stats:
    """Figures of a pretraining or SFT cache (root or split directory), a packed directory or a converted output."""
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise ConfigError(f"{path}: --seq-len must be a positive integer, got {seq_len!r}")
    root = Path(path)
    if not root.exists() and not megatron_prefix(root):
        raise StatsError(f"{root}: no such file or directory; pass a cache, a packed directory or a converted output")
    if (root / META_NAME).is_file():
        meta = read_meta(str(root))
        if meta["kind"] == "pretrain":
            return _pretrain(root, meta, ["train", "val"], progress)
        if meta["kind"] == "sft":
            return _sft(root, meta, ["train", "val"], seq_len, progress)
        raise StatsError(f"{root}: a {meta['kind']} directory, not a token cache; pass a cache built with it")
    if root.name in ("train", "val") and (root.parent / META_NAME).is_file():
        meta = read_meta(str(root.parent))
        if meta["kind"] == "pretrain":
            return _pretrain(root.parent, meta, [root.name], progress)
    if (root / PACKED_MANIFEST).is_file():
        return _packed(root)
    if root.suffix in PARQUET_SUFFIXES or (root.is_dir() and any(c.suffix in PARQUET_SUFFIXES for c in root.iterdir())):
        return _packed_parquet(root)
    info = foreign_output(root)
    if info is None and root.is_dir():
        caches = [c for c in find_caches(root) if read_meta(str(c))["kind"] in ("pretrain", "sft")]
        if caches:
            streams, kinds = [], set()
            for c in caches:
                one = cache_stats(c, seq_len=seq_len, progress=progress)
                kinds.add(one.kind)
                for s in one.streams:
                    s.name = f"{c.relative_to(root).as_posix()}/{s.name}"
                    streams.append(s)
            return Stats(str(root), "root of " + "+".join(sorted(kinds)), streams, {"caches": len(caches)})
    if info is not None:
        return _foreign(root, info, progress)
    raise StatsError(f"{root}: no {META_NAME}, {PACKED_MANIFEST} or token files of a known format: not a cache, "
                     "a packed directory or a converted output; pass one (see `niels-gpt-data inspect`)")


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
