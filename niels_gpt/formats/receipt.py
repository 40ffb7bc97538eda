"""`niels_receipt.json`: the sha256 and size of every file of an output whose format has no place for them
(what `convert` writes in every format but ours).

Layout (JSON, UTF-8, keys sorted):

    {"format": "niels_receipt", "version": 1,
     "output_format": "kempner-npy",                  # what the files are (detect_format's name)
     "files": {"train/shard_00000.npy": {"bytes": 1152, "sha256": "9f2c..."}, ...},
     "tokenizer_sha256": "c9ce...",                   # only when known: the tokenizer that made the ids
     "record_sha256": "5e1a..."}                      # the receipt's own checksum (niels_gpt/seals.py)

An output directory carries `<dir>/niels_receipt.json` listing every file below it (metadata.yaml included).
Written last, it is the commit marker; the peers
never read it. `check_receipt` (verify) re-hashes every listed file and names any unlisted one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from niels_gpt.atomic import write_bytes_atomic
from niels_gpt.confine import confined_all
from niels_gpt.constants import RECEIPT_NAME
from niels_gpt.errors import CacheMismatchError, FormatError
from niels_gpt.meta import disk_problem, file_record
from niels_gpt.seals import seal_problem, sealed_bytes

FORMAT = "niels_receipt"
VERSION = 1


def receipt_path(output: str | os.PathLike) -> Path:
    return Path(output) / RECEIPT_NAME


def _listed(output: Path) -> list[Path]:
    return sorted(f for f in output.rglob("*") if f.is_file() and f.name != RECEIPT_NAME)


def write_receipt(output: str | os.PathLike, output_format: str, *, tokenizer_sha256: str | None = None) -> None:
    """Hash every file below directory `output` and write its receipt last; `tokenizer_sha256` lets
    `inspect --tokenizer` refuse another tokenizer on formats with no place for it."""
    output = Path(output)
    files = {f.relative_to(output).as_posix(): file_record(f, None) for f in _listed(output)}
    receipt = {"format": FORMAT, "version": VERSION, "output_format": output_format, "files": files}
    if tokenizer_sha256:
        receipt["tokenizer_sha256"] = tokenizer_sha256
    write_bytes_atomic(receipt_path(output), sealed_bytes(receipt))


def read_receipt(path: str | os.PathLike) -> dict:
    """Read and check a receipt file (its own fields, not the files it lists)."""
    path = Path(path)
    fix = "re-run the command that wrote this output"
    try:
        data = path.read_bytes()
        receipt = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(f"{path}: not valid JSON ({exc}); the receipt is corrupt: {fix}") from exc
    problem = seal_problem(path, data, receipt, fix) if isinstance(receipt, dict) else None
    if problem is not None:
        raise CacheMismatchError(problem)
    ok = (isinstance(receipt, dict) and receipt.get("format") == FORMAT and receipt.get("version") == VERSION
          and isinstance(receipt.get("files"), dict) and isinstance(receipt.get("output_format"), str))
    if not ok:
        raise FormatError(f"{path}: not a {FORMAT} version {VERSION} (format, version, output_format and files "
                          "are required); the receipt is corrupt: re-run the command that wrote this output")
    confined_all(receipt["files"], path, "files", error=FormatError, fix="re-run the command that wrote this output")
    for rel, rec in receipt["files"].items():
        good = isinstance(rec, dict) and isinstance(rec.get("bytes"), int) and isinstance(rec.get("sha256"), str)
        if not good:
            raise FormatError(f"{path}: entry {rel!r} needs a relative path, integer bytes and a sha256; "
                              "the receipt is corrupt: re-run the command that wrote this output")
    return receipt


def check_receipt(path: str | os.PathLike) -> tuple[dict | None, list[str]]:
    """(receipt, problems): every listed file re-hashed, and every unlisted file below the output."""
    path = Path(path)
    try:
        receipt = read_receipt(path)
    except FormatError as exc:
        return None, [str(exc)]
    base = path.parent
    problems = []
    for rel, rec in sorted(receipt["files"].items()):
        problem = disk_problem(base / rel, rec, path.name, fix=": re-run the command that wrote it")
        if problem is not None:
            problems.append(problem)
    for f in _listed(base):
        if f.relative_to(base).as_posix() not in receipt["files"]:
            what = "a temporary file of a killed run" if ".tmp-" in f.name else "a file added later"
            problems.append(f"{f}: not listed in {path} ({what}); remove it")
    return receipt, problems
