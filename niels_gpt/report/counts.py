"""`cache_stats(path)`: the figures of a pretraining or SFT cache (or a root of several), packed bins
(memmap or Parquet) or a converted output. What the path holds is niels_gpt.locate's to say."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from niels_gpt.constants import MANIFEST_NAME, META_NAME, SPLITS
from niels_gpt.errors import ConfigError
from niels_gpt.locate import locate
from niels_gpt.meta import numpy_dtype, read_meta
from niels_gpt.packing.factory import open_packed
from niels_gpt.packing.memmap_format import read_manifest
from niels_gpt.progress import progress_bar, should_show
from niels_gpt.readers.shards import shard_array
from niels_gpt.report.figures import (
    Stats,
    StatsError,
    StreamStats,
    length_figures,
    stream_stats,
)
from niels_gpt.report.found import find_caches
from niels_gpt.spans import assistant_token_mask


def _bos_id(meta: dict) -> int | None:
    found = ((meta.get("tokenizer") or {}).get("bos_id"), (meta.get("special_token_ids") or {}).get("bos"))
    return next((v for v in found if isinstance(v, int) and v >= 0), None)


def _pretrain(cache: Path, meta: dict, splits: list[str], progress) -> Stats:
    dtype = numpy_dtype(meta["token_dtype"])
    separator = "bos" if (meta.get("document_separator") or {}).get("token") == "bos" else "eot"
    eot_id = (meta.get("special_token_ids") or {}).get("eot")
    streams = []
    for split in splits:
        rels = sorted(r for r in meta["files"] if r.startswith(f"{split}/") and r.endswith((".bin", ".bin.zst")))
        arrays = [shard_array(cache / r, meta, meta["files"][r], dtype) for r in rels]  # .bin.zst: compressed
        streams.append(stream_stats(split, arrays, eot_id=eot_id, bos_id=_bos_id(meta), separator=separator,
                                    progress=progress))
    return Stats(str(cache), "pretrain", streams, {"dataset_name": meta.get("dataset_name")})


def lose_all_trained(mask: np.ndarray, starts: np.ndarray, seq_len: int) -> int:
    """Examples whose trained targets all lie past position seq_len (a window holds seq_len+1 tokens)."""
    trained_pos = np.append(np.flatnonzero(mask), len(mask))
    # the first trained position after each start (len(mask) if none): before its end, within seq_len
    first_pos = trained_pos[np.searchsorted(trained_pos, starts + 1)]
    keeps = (first_pos < np.append(starts[1:], len(mask))) & (first_pos <= starts + seq_len)
    return int(np.count_nonzero(~keeps))


def _sft(cache: Path, meta: dict, seq_len: int, progress) -> Stats:
    dtype = numpy_dtype(meta["token_dtype"])
    specials = meta.get("special_token_ids") or {}
    eot_id, asst_id = specials.get("eot"), specials.get("asst")
    streams = []
    for split in SPLITS:
        tok_path = cache / f"{split}_tokens.bin"
        if f"{split}_tokens.bin" not in meta["files"]:
            continue
        arr = np.memmap(tok_path, dtype=dtype, mode="r") if tok_path.stat().st_size else np.zeros(0, dtype)
        starts = np.load(cache / f"{split}_idx.npy", allow_pickle=False).astype(np.int64)
        with progress_bar(total=len(arr), unit="tok", unit_scale=True, desc=f"stats {split}",
                          progress=should_show(progress)) as bar:
            lengths = np.diff(np.append(starts, len(arr)))
            n_eot, n_bos = (None if i is None else int(np.count_nonzero(arr == i))
                            for i in (eot_id, _bos_id(meta)))
            if f"{split}_mask.bin" in meta["files"]:
                mask = np.fromfile(cache / f"{split}_mask.bin", dtype=np.uint8).astype(bool)
            elif asst_id is not None and eot_id is not None:
                mask = assistant_token_mask(arr, asst_id, eot_id, seq_starts=starts)
            else:
                mask = None
            bar.update(len(arr))
        figures, hist = length_figures(lengths)
        s = StreamStats(name=split, tokens=len(arr), documents=len(starts), eot=n_eot, bos=n_bos, lengths=figures,
                        seq_len=seq_len, cut_examples=int(np.count_nonzero(lengths > seq_len + 1)), **hist)
        if mask is not None:
            s.trained_tokens = int(np.count_nonzero(mask))
            s.trained_fraction = s.trained_tokens / len(arr) if len(arr) else 0.0
            s.lose_all_trained = lose_all_trained(mask, starts, seq_len) if len(starts) else 0
        streams.append(s)
    return Stats(str(cache), "sft", streams, {"dataset_name": meta.get("dataset_name")})


def _packed(root: Path, name: str = "bins") -> Stats:
    manifest = read_manifest(root)
    pack_size = int(manifest["pack_size"])
    files = manifest["files"]
    packed_len = np.load(root / files["packed_len"]["name"], mmap_mode="r").astype(np.int64)
    offsets = np.load(root / files["seq_offsets"]["name"], mmap_mode="r").astype(np.int64)
    starts = np.load(root / files["seq_starts"]["name"], mmap_mode="r").astype(np.int64)
    loss_mask = np.load(root / files["loss_mask"]["name"], mmap_mode="r")
    per_bin = np.diff(offsets)
    ends = np.append(starts[1:], 0)  # a sequence ends where the next starts, the last of a bin at its length
    ends[offsets[1:][per_bin > 0] - 1] = packed_len[per_bin > 0]
    trained = int(np.count_nonzero(np.asarray(loss_mask)))
    out = _bins_stats(root, packed_len, ends - starts, per_bin, trained, pack_size, name)
    if (root / "val" / MANIFEST_NAME).is_file() and name == "bins":  # pack-sft's packed val split
        val = _packed(root / "val", name="val")
        out.streams += val.streams
        out.extra["val"] = {k: val.extra[k] for k in ("bins", "efficiency")}
    return out


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
                pack_size: int, name: str = "bins") -> Stats:
    nb = len(packed_len)
    fill = packed_len / pack_size if nb and pack_size else np.zeros(0)
    counts, edges = np.histogram(fill, bins=20, range=(0.0, 1.0))
    figures, hist = length_figures(seq_lengths)
    tokens = int(packed_len.sum())
    stream = StreamStats(name=name, tokens=tokens, documents=len(seq_lengths), eot=None, bos=None, lengths=figures,
                         trained_tokens=trained, trained_fraction=trained / tokens if tokens else 0.0, **hist)
    extra = {"pack_size": pack_size, "bins": nb, "efficiency": tokens / (nb * pack_size) if nb and pack_size else 1.0,
             "fill_counts": counts.tolist(), "fill_edges": edges.tolist(),
             "fill_mean": float(fill.mean()) if nb else 0.0, "sequences_per_bin_mean": float(per_bin.mean()) if nb else 0.0}
    return Stats(str(root), "packed", [stream], extra)


def _foreign(root: Path, info, progress) -> Stats:
    streams = []
    for name, leaf in (info.splits.items() if info.splits else [("all", info)]):
        arrays = [tf.open() for tf in leaf.token_files if tf.count]
        streams.append(stream_stats(name, arrays, eot_id=leaf.eot_id, bos_id=leaf.bos_id,
                                    separator="eot" if leaf.eot_id is not None else "bos", progress=progress))
    return Stats(str(root), info.format, streams, {})


MAX_SEQ_LEN = 2**31 - 1  # the figures index tokens as int64: T past this means nothing


def cache_stats(path: str | Path, *, seq_len: int = 1024, progress: bool | None = None) -> Stats:
    """Figures of a pretraining or SFT cache (root or split directory), a packed directory or a converted output."""
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise ConfigError(f"{path}: --seq-len must be a positive integer, got {seq_len!r}")
    if seq_len > MAX_SEQ_LEN:
        raise ConfigError(f"{path}: --seq-len {seq_len:,} is past any sequence length a model trains at (at most "
                          f"{MAX_SEQ_LEN:,} here); pass the T you train with")
    root = Path(path)
    found = locate(root)  # the one door: what the path holds, or one line (missing, an unfinished build, ...)
    if found.kind in ("pretrain", "sft"):
        meta = read_meta(str(found.root))  # checked: schema and seal
        if found.kind == "pretrain":
            return _pretrain(found.root, meta, [found.split] if found.split else list(SPLITS), progress)
        return _sft(found.root, meta, seq_len, progress)
    refused = {
        "not-built": f"{found.root}: its {META_NAME} says built: false (a source build-all was told not to "
                     "build); nothing to count: build it first",
        "tokenizer": f"{root}: a tokenizer directory, not a token cache; pass a cache built with it",
        "mixture": f"{root}: a mixture file; its figures are mixture_stats' (`stats {root} --steps N`)",
        "text-parquet": f"{root}: Parquet text shards, not tokens; build a cache from them first "
                        f"(`build {root} --out cache/NAME --tokenizer TOK`)"}
    if found.kind in refused:
        raise StatsError(refused[found.kind])
    if found.kind == "packed":
        if found.layout == "memmap":
            return _packed(found.path)
        if found.layout == "parquet":
            return _packed_parquet(found.path)
        raise StatsError(f"{root}: legacy pickled packed bins; convert them once (convert_legacy_to_memmap), then "
                         "count the converted directory")
    if found.kind == "foreign":
        return _foreign(root, found.info, progress)
    caches = [c for c in find_caches(root) if read_meta(str(c))["kind"] in ("pretrain", "sft")]
    if not caches:  # a root of packed directories or tokenizers only
        raise StatsError(f"{root}: no cache of tokens below it (pretrain or sft {META_NAME}); pass a cache, a "
                         f"packed directory ({MANIFEST_NAME}) or a converted output (see `niels-gpt-data inspect`)")
    streams, kinds = [], set()
    for c in caches:
        one = cache_stats(c, seq_len=seq_len, progress=progress)
        kinds.add(one.kind)
        for s in one.streams:
            s.name = f"{c.relative_to(root).as_posix()}/{s.name}"
        streams += one.streams
    return Stats(str(root), "root of " + "+".join(sorted(kinds)), streams, {"caches": len(caches)})
