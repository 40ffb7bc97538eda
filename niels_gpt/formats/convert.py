"""Convert a token corpus between formats, keeping every token and every document boundary.

    convert("cache/pretrain/wikitext", "out/nanogpt", to="nanogpt", bos_index=True)

- The source (detect_format: any format, a root with train/ and val/, or one split) is read as a document
  stream (formats/base.py); the writer frames each document its own way (niels/raw/kempner-npy: tokens + EOT;
  nanogpt with a BOS: BOS + tokens; megatron: one sequence = tokens + EOT).
- With no BOS given the BOS is the EOT id, and vice versa (modded-nanogpt's `<|endoftext|>`):
  `d1 E d2 E` <-> `E d1 E d2`.
- Every output gets a tatm metadata.yaml (dtype, vocab size, EOT/BOS ids), our cache its meta.json, so any
  result converts back without flags; the other formats end with `niels_receipt.json` (formats/receipt.py).
- `compress="zstd"` (to="niels" only): the shards of the uncompressed output as zstd frames (formats/zstd_shard.py).
- Memory is one block (BLOCK_TOKENS) plus one document. The output is built aside (niels_gpt/staging.py) and
  swapped in whole: a killed run leaves the previous `<dst>` or none, and its rerun succeeds.

Cost: one pass of reads and writes plus one Python step per document (figures: docs/formats.md).
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import numpy as np

from niels_gpt.atomic import write_bytes_atomic
from niels_gpt.constants import SHARD_BYTES, SPLITS
from niels_gpt.errors import ConfigError, FormatError
from niels_gpt.formats import kempner, megatron, nanogpt
from niels_gpt.formats.base import (
    DocStream,
    Framer,
    RollingWriter,
    check_ids,
    dtype_name,
    iter_blocks,
    parse_dtype,
    split_bos,
    split_eos,
)
from niels_gpt.formats.bos_index import load_bos_index
from niels_gpt.formats.detect import FORMATS, FormatInfo, detect_format
from niels_gpt.formats.names import NAMES, ONE_FILE, canonical_format
from niels_gpt.formats.npy import NpySink
from niels_gpt.formats.raw import RawSink, kempnerforge_note
from niels_gpt.formats.receipt import write_receipt
from niels_gpt.formats.writers import MIN_SHARD_BYTES, SHARD_PATTERN, check_shard_bytes, refuse_packed_bins
from niels_gpt.formats.zstd_shard import SUFFIX, FrameEncoder, check_compress, compression_meta
from niels_gpt.meta import write_meta
from niels_gpt.output_guard import check_output
from niels_gpt.sources.origins import origins_meta, split_origins, write_joined
from niels_gpt.staging import build_aside
from niels_gpt.urls import is_url


def open_stream(info: FormatInfo, *, eot_id: int | None = None, bos_id: int | None = None) -> DocStream:
    """A leaf FormatInfo as a document stream; `eot_id`/`bos_id` override what the files record."""
    eot = eot_id if eot_id is not None else info.eot_id
    bos = bos_id if bos_id is not None else info.bos_id
    if info.format.startswith("nanogpt") and bos is None and info.token_files:  # a sidecar names its BOS id
        found = load_bos_index(info.token_files[0].path, info.token_files[0].open(), None)
        bos = found[1] if found else None
    framing = "bos" if info.format.startswith("nanogpt") and bos is not None else "eos"
    open_tail = bool((info.meta or {}).get("last_document_open")) if info.format != "niels" else False
    if info.format == "megatron":
        pieces = _megatron_pieces(info, eot, open_tail)
    elif framing == "bos":
        pieces = split_bos(iter_blocks(info.token_files), bos, close_at_end=not open_tail)
    elif eot is not None:
        pieces = split_eos(iter_blocks(info.token_files), eot)
    else:  # no known document framing: all of it is one open document
        pieces = ((blk, False) for blk in iter_blocks(info.token_files))
    dtype = info.dtype if info.dtype.kind == "u" else np.dtype("<u4")
    return DocStream(pieces, dtype, eot_id=eot, bos_id=bos if framing == "bos" else info.bos_id,
                     source={"format": info.format, "path": info.path, "framing": framing})


def _megatron_pieces(info: FormatInfo, eot: int | None, open_tail: bool):
    last_doc = sum(len(i.doc_indices) - 1 for i in info.megatron) - 1
    doc = 0
    for index in info.megatron:
        for part, ends in megatron.iter_documents(index):
            if ends and eot is not None and len(part) and part[-1] == eot:
                part = part[:-1]
            elif ends and open_tail and doc == last_doc:
                ends = False  # the writer recorded a last document cut short, without its EOT
            yield part, ends
            doc += ends


class _Target:
    """Writes one split of a stream in one format into `directory`."""

    def __init__(self, to: str, directory: Path, name: str, *, dtype, eot, bos, bos_index: bool,
                 max_tokens: int | None, shard_bytes: int, compress: str | None = None):
        directory.mkdir(parents=True, exist_ok=True)
        self.framer = Framer(eos=eot, bos=bos, dtype=dtype) if eot is not None or bos is not None else None
        if to == "megatron":
            self.sink = megatron.MegatronWriter(directory / name, dtype)
            return
        if to in ("nanogpt", "nanogpt-legacy"):
            legacy = to == "nanogpt-legacy"
            nanogpt.make_header(0, dtype, legacy=legacy)  # rejects uint32 for legacy up front
            make = partial(nanogpt.NanogptSink, dtype=dtype, legacy=legacy, bos_id=bos if bos_index else None)
            names = partial(nanogpt.shard_name, name)
            limit = max_tokens or nanogpt.MAX_TOKENS_PER_FILE
        elif to == "kempner-npy":
            make, names = partial(NpySink, dtype=dtype), kempner.SHARD_PATTERN.format
            limit = max_tokens or kempner.MAX_TOKENS_PER_FILE
        else:  # raw and niels shards (niels ones maybe as zstd frames)
            make = partial(ZstdSink if compress else RawSink, dtype=dtype)
            names = (SHARD_PATTERN + (SUFFIX if compress else "")).format
            limit = max_tokens or shard_bytes // dtype.itemsize  # check_shard_bytes: at least MIN_SHARD_BYTES
        self.sink = RollingWriter(lambda i: make(directory / names(i)), limit)

    def write_piece(self, content: np.ndarray, ends: bool) -> None:
        for part in self.framer.frame(content, ends) if self.framer else [content]:
            self.sink.write(part)
        if ends and isinstance(self.sink, megatron.MegatronWriter):
            self.sink.end_document()  # one sequence per document

    def close(self) -> list[dict]:
        records = self.sink.close()  # one Megatron pair, or the rolled files
        return [records] if isinstance(records, dict) else records

    def abort(self) -> None:
        self.sink.abort()


class ZstdSink(RawSink):
    """A niels shard written as zstd frames (the RawSink interface; its record adds "frames")."""

    def __init__(self, path, dtype):
        super().__init__(path, dtype)
        self._file = FrameEncoder(self._file, self.dtype)


def write_converted_meta(out: Path, summary: dict, source: FormatInfo, *, shard_bytes: int, dataset_name: str,
                         compress: str | None, origins: dict | None) -> None:
    """meta.json for a cache written by `convert --to niels`: what the source recorded, else null (a foreign
    corpus: no tokenizer_sha256 or vocab_size, special_token_ids only the EOT id). `origins`: the files
    records of the origins written beside it."""
    splits = summary["splits"]
    first = next(iter(splits.values()))
    leaf = first["leaf"]
    files, totals = {}, {}
    for s in SPLITS:
        (out / s).mkdir(parents=True, exist_ok=True)
        info = splits.get(s)
        totals[f"{s}_tokens"] = info["tokens"] if info else 0
        totals[f"{s}_documents"] = info["documents"] if info else 0
        for rec in (info["records"] if info else []):
            rel = Path(rec["path"]).relative_to(out).as_posix()
            files[rel] = {k: rec[k] for k in ("bytes", "tokens", "sha256", "frames") if k in rec}
    eot = first["eot_id"]
    special = dict(leaf.special_token_ids or {})
    for k in ("sys", "usr", "asst"):
        special.setdefault(k, None)
    special["eot"] = eot
    files.update(origins or {})
    src_meta = source.meta if source.format == "niels" else None
    write_meta(str(out), {
        "kind": "pretrain",
        "format_version": 1,
        "built": True,
        "dataset_name": dataset_name,
        "dataset_config": (src_meta or {}).get("dataset_config"),
        "split_rule": (src_meta or {}).get("split_rule")
        or (f"the source's train/val directories ({source.format})" if source.splits
            else f"converted from one {source.format} stream: all of it is the '{next(iter(splits))}' split"),
        "seed": (src_meta or {}).get("seed"),
        "token_dtype": first["dtype"] + "-le",
        "tokenizer_sha256": leaf.tokenizer_sha256,
        "tokenizer": (src_meta or {}).get("tokenizer"),
        "vocab_size": leaf.vocab_size,
        "special_token_ids": special,
        "shard_bytes": shard_bytes,
        "shard_pattern": SHARD_PATTERN.replace("{:05d}", "NNNNN") + (SUFFIX if compress else ""),
        "document_separator": {"token": "eot", "id": eot, "position": "after every document"},
        "totals": totals,
        "files": files,
        "streaming": False,
        "source": {"converted_from": {"format": source.format, "path": str(source.path)},
                   "unterminated_tail": {s: v["unterminated_tail"] for s, v in splits.items()}},
        "build": {"converted": True, "shard_bytes": shard_bytes},
        **({"compression": compression_meta()} if compress else {}),
        **({"origins": origins_meta()} if origins else {}),
    })


def _resolve_ids(to: str, stream: DocStream, *, bos_index: bool, bos_id):
    """(eot, bos) framing ids of the output (the stream's EOT is --eot-id when given): exactly one is set, or
    neither for pass-through."""
    eot = stream.eot_id if stream.eot_id is not None else stream.bos_id
    src_bos = stream.source.get("framing") == "bos"
    if to.startswith("nanogpt") and (bos_index or bos_id is not None or src_bos):
        bos = bos_id if bos_id is not None else (stream.bos_id if src_bos else eot)
        if bos is None:
            raise ConfigError(f"{stream.source['path']}: no BOS or EOT id known for --bos-index; "
                              "pass --bos-id N")
        return None, bos
    if bos_index:
        raise ConfigError("--bos-index applies to --to nanogpt / nanogpt-legacy only")
    if to == "niels" and eot is None:
        raise ConfigError(f"{stream.source['path']}: our caches end every document with EOT, and no EOT "
                          "id is known for this source; pass --eot-id N")
    return eot, None


ORIGINS_DIR = "origins"  # beside a converted split's files: origins.npy + origins.json of its documents


def _source_origins(src, info: FormatInfo, summary: dict) -> dict[str, tuple[bytes, bytes]]:
    """split -> (its origins array's bytes, its inputs table's) when the source is a cache of ours recording
    origins and every document came through whole; else {} (with a note when the counts differ)."""
    meta = info.meta if info.format == "niels" else None
    if not meta or "origins" not in meta or not info.splits:
        return {}
    root = Path(src)
    out = {}
    for name, split in summary["splits"].items():
        found = split_origins(root, meta, name)
        if found is None:
            continue
        rows, table, n = found
        if n != split["documents"]:
            summary["notes"].append(f"{root / meta['origins']['file']}: {n} {name} origins for {split['documents']} "
                                    "documents converted; the origins are left out of this split")
            continue
        out[name] = (rows, table)
    return out


def _out_dtype(stream: DocStream, vocab: int | None, dtype) -> np.dtype:
    if dtype is None:
        return stream.dtype
    out = parse_dtype(dtype)
    if vocab is not None and vocab - 1 > np.iinfo(out).max:
        raise ConfigError(f"--dtype {dtype_name(out)}: the source's vocabulary has {vocab:,} ids, more than "
                          f"{dtype_name(out)} holds ({np.iinfo(out).max + 1:,}); drop --dtype (the output keeps "
                          f"{dtype_name(stream.dtype)}) or convert with --dtype uint32")
    return out


def convert(src: str | os.PathLike, dst: str | os.PathLike, *, to: str, bos_index: bool = False,
            bos_id: int | None = None, eot_id: int | None = None, dtype=None, src_dtype=None,
            split: str = "train", max_tokens_per_file: int | None = None,
            shard_bytes: int = SHARD_BYTES, dataset_name: str | None = None,
            not_for_kempnerforge: bool = False, compress: str | None = None) -> dict:
    """Convert `src` (any format) into directory `dst` (new, empty, or an earlier output of ours of the same
    kind, replaced whole) in format `to`, any name of formats/names.py. Returns a summary.

    `to="raw"` notes uint16 files KempnerForge would misread (kempnerforge_note) unless `not_for_kempnerforge`.
    """
    for role, where in (("source", src), ("destination", dst)):
        if is_url(where):  # NOTE: Path("s3://b/x") is the local path "s3:/b/x"; never let it get that far
            raise ConfigError(f"{where}: a URL as the {role}; convert reads and writes local paths only "
                              "(remote output is not supported by convert): convert to a local directory, "
                              "then upload it")
    check_shard_bytes(shard_bytes, "--shard-bytes")
    if max_tokens_per_file is not None and max_tokens_per_file < MIN_SHARD_BYTES // 2:
        raise ConfigError(f"--max-tokens-per-file={max_tokens_per_file}: files must hold at least "
                          f"{MIN_SHARD_BYTES // 2} tokens (tiny files only multiply files); leave it unset for "
                          "the format's own default")
    asked, to = to, canonical_format(to)  # `automodel`, `modded-nanogpt`, `nanogpt-train-bin`: formats/names.py
    if asked == "nanogpt-train-bin":  # the preset: one file per split, read as uint16 by nanoGPT's train.py
        max_tokens_per_file, not_for_kempnerforge = max_tokens_per_file or ONE_FILE, True
    if to not in FORMATS:
        raise ConfigError(f"unknown target format {to!r}; expected one of {', '.join(NAMES)}")
    if compress is not None and to != "niels":
        raise ConfigError(f"--compress applies to --to niels (our cache) only, not --to {to}: the peers' readers "
                          "read raw tokens")
    check_compress(compress)
    kind = "cache" if to == "niels" else "converted"
    dst = check_output(dst, kind=kind, flag="DST", inputs=[src])  # before any work
    refuse_packed_bins(src, "convert")
    info = detect_format(src, src_dtype)
    check_ids(info.dtype, eot_id=eot_id, bos_id=bos_id)
    if asked == "nanogpt-train-bin" and (parse_dtype(dtype) if dtype is not None else info.dtype) != np.uint16:
        raise FormatError(f"{src}: {info.dtype.name} tokens, but nanoGPT's train.py reads train.bin/val.bin as "
                          "uint16: pass --dtype uint16 (refused if an id does not fit), or use --to raw for a reader "
                          "that is told the dtype")
    leaves = info.splits or {split: info}
    summary: dict = {"source": info.format, "to": to, "splits": {}, "notes": list(info.warnings)}
    with build_aside(dst, kind=kind, flag="DST") as tmp:
        for name, leaf in leaves.items():
            stream = open_stream(leaf, eot_id=eot_id, bos_id=bos_id)
            eot, bos = _resolve_ids(to, stream, bos_index=bos_index, bos_id=bos_id)
            out_dtype = _out_dtype(stream, leaf.vocab_size, dtype)
            sub = tmp / name if (info.splits or to == "niels") else tmp
            target_name = name if info.splits else ("tokens" if to != "niels" else name)
            target = _Target(to, sub, target_name, dtype=out_dtype, eot=eot, bos=bos, bos_index=bos_index,
                             max_tokens=max_tokens_per_file, shard_bytes=shard_bytes, compress=compress)
            try:
                for content, ends in stream.pieces:
                    target.write_piece(content, ends)
                records = target.close()
            except BaseException:
                target.abort()
                raise
            if to == "raw" and not not_for_kempnerforge:
                summary["notes"].extend(filter(None, [kempnerforge_note({r["path"]: r["tokens"] for r in records},
                                                                         out_dtype, dst)]))
            fr = target.framer
            summary["splits"][name] = {
                "records": records, "tokens": sum(r["tokens"] for r in records),
                "documents": fr.documents if fr else None, "eot_id": eot, "bos_id": bos,
                "dtype": dtype_name(out_dtype), "leaf": leaf,
                # a tail after the last EOT (our builder cuts the document that crosses a token
                # budget) is kept as is, never completed: every token survives, none is added
                "unterminated_tail": bool(fr and fr.opened),
            }
            if to != "niels":
                kempner.write_metadata(sub, dtype=dtype_name(out_dtype), vocab_size=leaf.vocab_size,
                                       eos_token_id=next((v for v in (stream.eot_id, eot, bos)
                                                          if v is not None), None),
                                       tokenizer_sha256=leaf.tokenizer_sha256,
                                       extension="npy" if to == "kempner-npy" else "bin",
                                       file_prefix=target_name if to in ("nanogpt", "nanogpt-legacy", "megatron")
                                       else "shard",
                                       bos_token_id=bos, last_document_open=bool(fr and fr.opened))
        origins = _source_origins(src, info, summary)
        if to == "niels":
            write_converted_meta(tmp, summary, info, shard_bytes=shard_bytes, dataset_name=dataset_name or dst.name,
                                 compress=compress, origins=write_joined(tmp, origins) if origins else None)
        else:
            for name, (rows, table) in origins.items():  # a sidecar beside the split's files, in the receipt
                side = (tmp / name if info.splits else tmp) / ORIGINS_DIR
                side.mkdir(parents=True, exist_ok=True)
                write_bytes_atomic(side / "origins.npy", rows)
                write_bytes_atomic(side / "origins.json", table)
            write_receipt(tmp, to, tokenizer_sha256=info.tokenizer_sha256)  # last: the sha256 of every file, metadata.yaml included
    for s in summary["splits"].values():
        del s["leaf"]
        for r in s["records"]:
            for key in ("path", "bos_index", "idx"):
                if key in r:
                    r[key] = str(dst / Path(r[key]).relative_to(tmp))
    return summary
