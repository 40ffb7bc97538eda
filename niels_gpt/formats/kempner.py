"""KempnerForge flat shard directories: `*.npy` or raw `*.bin`, plus an optional tatm metadata.yaml.

Layout:

    dir/
      shard_00000.npy ...   NPY v1/v2, 1-D, '<u2' or '<u4' (niels_gpt.formats.npy), or
      shard_00000.bin ...   raw LE tokens, no header (niels_gpt.formats.raw)
      metadata.yaml         optional (tatm):  tokenized_info: {tokenizer, dtype, vocab_size,
                                              file_prefix, file_extension, eos_token_id}
                            we add: bos_token_id (the BOS of BOS-prefixed shards),
                            last_document_open (the stream ends inside a document without EOT),
                            tokenizer_sha256

Files are read in name order, each a flat array; documents end with EOS and may run on into the next file.
A `.bin`'s dtype comes from metadata.yaml or the caller, never from its size (KempnerForge's guess).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from niels_gpt.atomic import write_bytes_atomic
from niels_gpt.constants import RECEIPT_NAME
from niels_gpt.errors import FormatError
from niels_gpt.formats.base import file_order
from niels_gpt.meta import sha256_file

METADATA_NAME = "metadata.yaml"
SHARD_PATTERN = "shard_{:05d}.npy"
MAX_TOKENS_PER_FILE = 1 << 28  # 512 MiB of uint16 per shard


def read_metadata(directory: str | os.PathLike) -> dict | None:
    """tokenized_info of a tatm metadata.yaml, or None when there is none."""
    path = Path(directory) / METADATA_NAME
    if not path.is_file():
        return None
    import yaml

    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise FormatError(f"{path}: byte {exc.start} is not UTF-8 (0x{exc.object[exc.start]:02x}); the file is "
                          "corrupt: restore it, or re-convert the directory") from exc
    except yaml.YAMLError as exc:
        reason = " ".join(str(exc).split())
        raise FormatError(f"{path}: not valid YAML ({reason}); fix or delete it") from exc
    info = doc.get("tokenized_info") if isinstance(doc, dict) else None
    if not isinstance(info, dict):
        raise FormatError(f"{path}: no 'tokenized_info' mapping; this is not a tatm metadata file")
    for key in ("vocab_size", "eos_token_id", "bos_token_id"):  # they steer every reader: never a guess
        v = info.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise FormatError(f"{path}: tokenized_info.{key} is {v!r}, not a whole number >= 0 (or null); fix it, or "
                              "set it to null and give the ids to the command (--eot-id, --bos-id)")
    check_against_receipt(path)
    return info


def check_against_receipt(path: Path) -> None:
    """The ids in metadata.yaml steer every reader: where the output's niels_receipt.json lists it, its sha256
    is checked on every open (a few hundred bytes)."""
    for root in (path.parent, path.parent.parent):
        receipt = root / RECEIPT_NAME
        if not receipt.is_file():
            continue
        try:
            listed = json.loads(receipt.read_text("utf-8")).get("files", {})
        except (OSError, ValueError, AttributeError):
            return  # a damaged receipt is verify's to report
        rec = listed.get(path.relative_to(root).as_posix()) if isinstance(listed, dict) else None
        if isinstance(rec, dict) and rec.get("sha256") != sha256_file(str(path)):
            raise FormatError(f"{path}: sha256 differs from {receipt} (the ids it records were changed after "
                              "convert wrote it); restore it or re-run convert")
        return


def write_metadata(directory: str | os.PathLike, *, dtype: str, vocab_size: int | None,
                   eos_token_id: int | None, extension: str = "npy",
                   bos_token_id: int | None = None, last_document_open: bool = False,
                   tokenizer_sha256: str | None = None, file_prefix: str = "shard") -> None:
    def scalar(v):
        # strings are JSON-quoted (valid YAML): an all-digit sha256 must not read back as a number
        return "null" if v is None else json.dumps(v) if isinstance(v, str) else str(v)

    text = (
        "tokenized_info:\n"
        "  tokenizer: null\n"
        f"  dtype: {dtype}\n"
        f"  tokenizer_sha256: {scalar(tokenizer_sha256)}\n"
        f"  vocab_size: {scalar(vocab_size)}\n"
        f"  eos_token_id: {scalar(eos_token_id)}\n"
        f"  bos_token_id: {scalar(bos_token_id)}\n"
        f"  last_document_open: {'true' if last_document_open else 'false'}\n"
        f"  file_prefix: {file_prefix}\n"
        f"  file_extension: {extension}\n"
    )
    write_bytes_atomic(Path(directory) / METADATA_NAME, text.encode("utf-8"))


def list_token_files(directory: str | os.PathLike, pattern: str | None = None) -> list[Path]:
    """Sorted token files of a directory: `pattern` if given, else every .npy or every .bin."""
    d = Path(directory)
    if pattern is not None:
        return sorted((p for p in d.glob(pattern) if p.is_file()), key=file_order)
    npy = sorted(d.glob("*.npy"), key=file_order)
    bins = sorted(d.glob("*.bin"), key=file_order)
    if npy and bins:
        raise FormatError(f"{d}: holds both .npy and .bin files; pass a file pattern ('*.npy' or '*.bin')")
    return npy or bins
