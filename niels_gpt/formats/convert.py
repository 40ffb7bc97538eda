"""Convert a token corpus between formats, keeping every token and every document boundary.

    convert("cache/pretrain/wikitext", "out/nanogpt", to="nanogpt", bos_index=True)

- The source is opened with detect_format (any format, a root with train/ and val/, or one split)
  and read as a document stream (niels_gpt.formats.base): EOT-terminated in our caches, KempnerForge
  and raw shards; BOS-prefixed in nanoGPT shards written with a BOS; one sequence per document in
  Megatron. The writer frames each document its own way (niels/raw/kempner-npy: tokens + EOT;
  nanogpt with a BOS: BOS + tokens; megatron: one sequence = tokens + EOT).
- One delimiter convention bridges the two framings (modded-nanogpt's: `<|endoftext|>` is both):
  with no BOS given, the BOS is the EOT id, and vice versa. So `d1 E d2 E` <-> `E d1 E d2`.
- Every output directory gets a tatm-style metadata.yaml (dtype, vocab size, EOT/BOS ids) and our
  cache gets its meta.json, so any result converts back without flags. Outputs in the other formats
  end with a `niels_receipt.json` (niels_gpt.formats.receipt): the sha256 and size of every file,
  checked by `verify`; the peers' readers never open it.
- `compress="zstd"` (with `to="niels"` only): shards as zstd frames plus a frame index, exactly the
  tokens and shards of the uncompressed output (niels_gpt/formats/zstd_shard.py; meta.json records it).
- Streaming: memory is one block (BLOCK_TOKENS) plus one document. The output is built aside
  (niels_gpt/staging.py: `<dst>.lock`, `<dst>.tmp-<pid>`, meta/idx files last inside it) and swapped in only
  when complete: a killed run leaves no `<dst>` or the previous one, and its rerun succeeds. An earlier
  output of ours of the same kind at `<dst>` (a converted corpus; a token cache for `--to niels`) is replaced.

Cost: one pass of reads and writes plus one Python step per document: 50 M uint16 tokens in
62.5 k documents take 3.4-5.7 s per target on 2 cores (`convert SRC DST --to T`, see docs/formats.md).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from niels_gpt.atomic import write_bytes_atomic
from niels_gpt.errors import ConfigError, FormatError
from niels_gpt.formats import kempner, megatron, nanogpt
from niels_gpt.formats.base import (
    DocStream,
    Framer,
    RollingWriter,
    dtype_name,
    iter_blocks,
    parse_dtype,
    split_bos,
    split_eos,
    unframed,
)
from niels_gpt.formats.bos_index import load_bos_index
from niels_gpt.formats.detect import FORMATS, FormatInfo, detect_format, write_converted_meta
from niels_gpt.formats.names import NAMES, ONE_FILE, canonical_format
from niels_gpt.formats.npy import NpySink
from niels_gpt.formats.raw import RawSink
from niels_gpt.formats.receipt import write_receipt
from niels_gpt.formats.writers import MIN_SHARD_BYTES, check_shard_bytes, refuse_packed_bins
from niels_gpt.formats.zstd_shard import SUFFIX, FrameEncoder, check_compress, compression_meta
from niels_gpt.meta import read_meta, write_meta
from niels_gpt.output_guard import check_output
from niels_gpt.sources.origins import origins_meta, split_origins, write_joined
from niels_gpt.staging import build_aside
from niels_gpt.urls import is_url

TARGETS = FORMATS


def open_stream(info: FormatInfo, *, eot_id: int | None = None, bos_id: int | None = None) -> DocStream:
    """A leaf FormatInfo as a document stream; `eot_id`/`bos_id` override what the files record."""
    eot = eot_id if eot_id is not None else info.eot_id
    bos = bos_id if bos_id is not None else info.bos_id
    framing = "eos"
    if info.format.startswith("nanogpt"):
        if bos is None and info.token_files:  # a sidecar names its BOS id
            tf = info.token_files[0]
            found = load_bos_index(tf.path, tf.open(), None)
            bos = found[1] if found else None
        framing = "bos" if bos is not None else "eos"
    open_tail = bool((info.meta or {}).get("last_document_open")) if info.format != "niels" else False
    if info.format == "megatron":
        pieces = _megatron_pieces(info, eot, open_tail)
    elif framing == "bos":
        pieces = split_bos(iter_blocks(info.token_files), bos, close_at_end=not open_tail)
    elif eot is not None:
        pieces = split_eos(iter_blocks(info.token_files), eot)
    else:
        pieces = unframed(iter_blocks(info.token_files))
    dtype = info.dtype if info.dtype.kind == "u" else np.dtype("<u4")
    return DocStream(pieces, dtype, eot_id=eot, bos_id=bos if framing == "bos" else info.bos_id,
                     vocab_size=info.vocab_size, tokenizer_sha256=info.tokenizer_sha256,
                     special_token_ids=info.special_token_ids,
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

    def __init__(self, to: str, directory: Path, name: str, stream: DocStream, *, dtype, eot, bos,
                 bos_index: bool, max_tokens: int | None, shard_bytes: int, compress: str | None = None):
        self.to, self.dir, self.dtype = to, directory, dtype
        directory.mkdir(parents=True, exist_ok=True)
        self.framer = None
        if bos is not None:
            self.framer = Framer(bos=bos, dtype=dtype)
        elif eot is not None:
            self.framer = Framer(eos=eot, dtype=dtype)
        self.megatron = None
        if to == "megatron":
            self.megatron = megatron.MegatronWriter(directory / name, dtype)
            return
        if to in ("nanogpt", "nanogpt-legacy"):
            legacy = to == "nanogpt-legacy"
            nanogpt.make_header(0, dtype, legacy=legacy)  # rejects uint32 for legacy up front
            side = bos if bos_index else None

            def open_file(i):
                return nanogpt.NanogptSink(directory / nanogpt.shard_name(name, i), dtype, legacy=legacy,
                                           bos_id=side)
            limit = max_tokens or nanogpt.MAX_TOKENS_PER_FILE
        elif to == "kempner-npy":
            def open_file(i):
                return NpySink(directory / kempner.SHARD_PATTERN.format(i), dtype)
            limit = max_tokens or kempner.MAX_TOKENS_PER_FILE
        elif compress:  # niels shards as zstd frames
            def open_file(i):
                return ZstdSink(directory / f"shard_{i:05d}.bin{SUFFIX}", dtype)
            limit = max_tokens or max(1, shard_bytes // dtype.itemsize)
        else:  # raw and niels shards
            def open_file(i):
                return RawSink(directory / f"shard_{i:05d}.bin", dtype)
            limit = max_tokens or max(1, shard_bytes // dtype.itemsize)
        self.rolling = RollingWriter(open_file, limit)

    def write_piece(self, content: np.ndarray, ends: bool) -> None:
        if self.megatron is not None:
            parts = self.framer.frame(content, ends) if self.framer else [content]
            for part in parts:
                self.megatron.write(part)
            if ends:
                self.megatron.end_document()
            return
        for part in self.framer.frame(content, ends) if self.framer else [content]:
            self.rolling.write(part)

    def close(self) -> list[dict]:
        if self.megatron is not None:
            return [self.megatron.close()]
        return self.rolling.close()

    def abort(self) -> None:
        (self.megatron or self.rolling).abort()


class ZstdSink(RawSink):
    """A niels shard written as zstd frames (the RawSink interface; its record adds "frames")."""

    def __init__(self, path, dtype):
        super().__init__(path, dtype)
        self._file = FrameEncoder(self._file, self.dtype)

    def close(self) -> dict:
        record = self._file.close()
        return {"path": str(self.path), "tokens": self.tokens, "bytes": record["bytes"], "sha256": record["sha256"],
                "frames": record["frames"]}


def _record_compression(tmp: Path, summary: dict) -> None:
    """meta.json of a compressed `--to niels` output: the frame layout and each shard's frame count."""
    meta = read_meta(str(tmp))
    frames = {Path(r["path"]).relative_to(tmp).as_posix(): r["frames"]
              for s in summary["splits"].values() for r in s["records"]}
    for rel, n in frames.items():
        meta["files"][rel]["frames"] = n
    meta["compression"] = compression_meta()
    meta["shard_pattern"] += SUFFIX
    write_meta(str(tmp), meta)


def _resolve_ids(to: str, stream: DocStream, *, bos_index: bool, bos_id, eot_id):
    """(eot, bos) framing ids of the output: exactly one is set, or neither for pass-through."""
    eot = eot_id if eot_id is not None else (stream.eot_id if stream.eot_id is not None else stream.bos_id)
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
    """split -> (the bytes of its origins array, of the inputs table) when the source is one of our caches that
    records origins (builders/origins.py) and every document came through whole; else {} (with a note when a
    split's documents differ in number from its origins)."""
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


def _carry_origins(tmp: Path, origins: dict) -> None:
    """A `--to niels` output keeps the source's origins as a cache of ours does: listed in meta.json."""
    meta = read_meta(str(tmp))
    meta["files"].update(write_joined(tmp, origins))
    meta["origins"] = origins_meta()
    write_meta(str(tmp), meta)


def kempnerforge_note(records: list[dict], dtype: np.dtype, dst) -> str | None:
    """What to say of uint16 raw files that KempnerForge's MemoryMappedDataset would misread, or None.

    It ignores metadata.yaml and takes uint32 whenever a .bin's size divides by 4, i.e. for every
    uint16 file with an even token count: 10 tokens (20 bytes) read as 5 garbage ids. Readers told the
    dtype (nanoGPT's train.py, np.memmap) read them right, so the files are written and this is a note.
    """
    if np.dtype(dtype).itemsize != 2:
        return None
    even = [r for r in records if r["tokens"] % 2 == 0]
    if not even:
        return None
    return (f"{dst}: uint16 .bin files with an even token count ({Path(even[0]['path']).name}: {even[0]['tokens']} "
            "tokens), which KempnerForge's MemoryMappedDataset reads as uint32 (it ignores metadata.yaml): for "
            "KempnerForge use --to kempner-npy (.npy records its dtype); readers told the dtype read them right")


def file_prefix(to: str, name: str) -> str:
    """The file name prefix metadata.yaml records: what every token file the target writes starts with."""
    return name if to in ("nanogpt", "nanogpt-legacy", "megatron") else "shard"


def _first(*values):
    return next((v for v in values if v is not None), None)


def _out_dtype(stream: DocStream, dtype) -> np.dtype:
    if dtype is None:
        return stream.dtype
    out = parse_dtype(dtype)
    vocab = stream.vocab_size
    if vocab is not None and vocab - 1 > np.iinfo(out).max:
        raise ConfigError(f"--dtype {dtype_name(out)}: the source's vocabulary has {vocab:,} ids, more than "
                          f"{dtype_name(out)} holds ({np.iinfo(out).max + 1:,}); drop --dtype (the output keeps "
                          f"{dtype_name(stream.dtype)}) or convert with --dtype uint32")
    return out


def convert(src: str | os.PathLike, dst: str | os.PathLike, *, to: str, bos_index: bool = False,
            bos_id: int | None = None, eot_id: int | None = None, dtype=None, src_dtype=None,
            split: str = "train", max_tokens_per_file: int | None = None,
            shard_bytes: int = 128 * 1024 * 1024, dataset_name: str | None = None,
            not_for_kempnerforge: bool = False, compress: str | None = None) -> dict:
    """Convert `src` (any format) into directory `dst` in format `to`. Returns a summary.

    `dst` is new, empty, or an earlier output of ours of the same kind, which is replaced whole.

    `to` is any name of formats/names.py: an alias writes its format; `nanogpt-train-bin` writes raw as one
    uint16 file per split (other dtypes refused). `--to raw` in uint16 with an even token count in a file adds a
    note to `summary["notes"]` (KempnerForge would read it as uint32, see kempnerforge_note) unless
    `not_for_kempnerforge` says the output is meant for a reader that takes the dtype from its caller.
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
    if to not in TARGETS:
        raise ConfigError(f"unknown target format {to!r}; expected one of {', '.join(NAMES)}")
    if compress is not None and to != "niels":
        raise ConfigError(f"--compress applies to --to niels (our cache) only, not --to {to}: the peers' readers "
                          "read raw tokens")
    check_compress(compress)
    kind = "cache" if to == "niels" else "converted"
    dst = check_output(dst, kind=kind, flag="DST", inputs=[src])  # before any work
    refuse_packed_bins(src, "convert")
    info = detect_format(src, src_dtype)
    if asked == "nanogpt-train-bin" and (dtype or info.dtype.name) != "uint16":
        raise FormatError(f"{src}: {info.dtype.name} tokens, but nanoGPT's train.py reads train.bin/val.bin as "
                          "uint16: pass --dtype uint16 (refused if an id does not fit), or use --to raw for a reader "
                          "that is told the dtype")
    leaves = info.splits or {split: info}
    summary: dict = {"source": info.format, "to": to, "splits": {}, "notes": []}
    with build_aside(dst, kind=kind, flag="DST") as tmp:
        for name, leaf in leaves.items():
            stream = open_stream(leaf, eot_id=eot_id, bos_id=bos_id)
            eot, bos = _resolve_ids(to, stream, bos_index=bos_index, bos_id=bos_id, eot_id=eot_id)
            out_dtype = _out_dtype(stream, dtype)
            sub = tmp / name if (info.splits or to == "niels") else tmp
            target_name = name if info.splits else ("tokens" if to != "niels" else name)
            target = _Target(to, sub, target_name,
                             stream, dtype=out_dtype, eot=eot, bos=bos, bos_index=bos_index,
                             max_tokens=max_tokens_per_file, shard_bytes=shard_bytes, compress=compress)
            try:
                for content, ends in stream.pieces:
                    target.write_piece(content, ends)
                records = target.close()
            except BaseException:
                target.abort()
                raise
            if to == "raw" and not not_for_kempnerforge:
                summary["notes"].extend(filter(None, [kempnerforge_note(records, out_dtype, dst)]))
            fr = target.framer
            summary["splits"][name] = {
                "records": records, "tokens": sum(r["tokens"] for r in records),
                "documents": fr.documents if fr else None, "eot_id": eot, "bos_id": bos,
                "dtype": dtype_name(out_dtype), "stream": stream,
                # a tail after the last EOT (our builder cuts the document that crosses a token
                # budget) is kept as is, never completed: every token survives, none is added
                "unterminated_tail": bool(fr and fr.opened),
            }
            if to != "niels":
                kempner.write_metadata(sub, dtype=dtype_name(out_dtype), vocab_size=stream.vocab_size,
                                       eos_token_id=_first(eot_id, stream.eot_id, eot, bos), tokenizer=None,
                                       tokenizer_sha256=stream.tokenizer_sha256,
                                       extension={"kempner-npy": "npy", "megatron": "bin"}.get(to, "bin"),
                                       file_prefix=file_prefix(to, target_name),
                                       bos_token_id=bos, last_document_open=bool(fr and fr.opened))
        origins = _source_origins(src, info, summary)
        if to == "niels":
            write_converted_meta(tmp, summary, info, shard_bytes=shard_bytes,
                                 dataset_name=dataset_name or dst.name)
            if compress:
                _record_compression(tmp, summary)
            if origins:
                _carry_origins(tmp, origins)
        else:
            for name, (rows, table) in origins.items():  # a sidecar beside the split's files, in the receipt
                side = (tmp / name if info.splits else tmp) / ORIGINS_DIR
                side.mkdir(parents=True, exist_ok=True)
                write_bytes_atomic(side / "origins.npy", rows)
                write_bytes_atomic(side / "origins.json", table)
            write_receipt(tmp, to, tokenizer_sha256=info.tokenizer_sha256)  # last: the sha256 of every file, metadata.yaml included
        for s in summary["splits"].values():
            s.pop("stream")
    for s in summary["splits"].values():
        for r in s["records"]:
            for key in ("path", "bos_index", "idx"):
                if key in r:
                    r[key] = str(dst / Path(r[key]).relative_to(tmp))
    return summary
