"""`datasets` streams with their failures named: what was opened, which record, which local file and line.

Hub-backed sources read through `datasets.load_dataset(..., streaming=True)`; local files of the same schema
take the same call with a packaged builder ("parquet", "json", "text"). `datasets` logs "Failed to load JSON
from file ..." before raising; the error raised here names the file and line instead, so that log line is
filtered out.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from niels_gpt.errors import ConfigError, SourceError
from niels_gpt.sources.text_io import first_invalid_utf8, invalid_utf8_error

# Local file suffix -> the `datasets` packaged builder that reads it.
BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".txt": "text", ".raw": "text"}
TEXT_SUFFIXES = (".txt", ".raw", ".jsonl", ".json", ".md")  # files worth scanning for bad UTF-8


def _drop_json_reader_errors(record: logging.LogRecord) -> bool:
    """`datasets` logs "Failed to load JSON from file ..." before raising; the error it raises is then
    explained here by file and line (`_raise_local_file_problem`), so the log line is only noise."""
    return not str(record.msg).startswith("Failed to load JSON from file")


logging.getLogger("datasets.packaged_modules.json.json").addFilter(_drop_json_reader_errors)




def builder_for(path: Path, what: str) -> str:
    b = BUILDERS.get(path.suffix.lower())
    if b is None:
        raise ConfigError(f"{path}: unsupported file type {path.suffix!r} for {what}; use one of "
                          f"{sorted(BUILDERS)}")
    return b


def builder_for_all(paths: Sequence[Path], what: str) -> str:
    kinds = {builder_for(p, what) for p in paths}
    if len(kinds) != 1:
        raise ConfigError(f"{what}: data_files mix file types ({sorted(kinds)}); pass files of one type")
    return kinds.pop()


def open_stream(path_or_id: str, what: str, *, streaming: bool = True, **kwargs: Any):
    """datasets.load_dataset(...) with failures turned into SourceError naming what was opened."""
    from datasets import load_dataset

    try:
        return load_dataset(path_or_id, streaming=streaming, **kwargs)
    except Exception as e:  # the hub, fsspec and pyarrow raise many kinds; the message is what helps
        local = [Path(f) for f in _as_list(kwargs.get("data_files"))]
        if local:  # local files: the network and the dataset id have nothing to do with it
            _raise_local_file_problem(local, what, e)
            raise SourceError(f"{what}: cannot read {[str(p) for p in local]}: {type(e).__name__}: {e}; check "
                              "that the files are valid and of the expected schema") from e
        raise SourceError(f"{what}: cannot open {path_or_id!r} ({_kwargs_text(kwargs)}): "
                          f"{type(e).__name__}: {e}; check the dataset id/config and network, or pass "
                          "local data_files") from e


def _as_list(value) -> list:
    if value is None:
        return []
    if isinstance(value, (str, os.PathLike)):
        return [value]
    if isinstance(value, dict):
        return [f for v in value.values() for f in _as_list(v)]
    return list(value)


def _raise_local_file_problem(files: Sequence[Path], what: str, cause: BaseException) -> None:
    """Name the file and line behind a `datasets` read failure, when our own reading can find it.

    `datasets` reads JSON Lines in blocks and reports a block's row (or nothing), so a bad line 2 used to
    surface as "record 0". Empty files are named as such, not blamed on a network.
    """
    for p in files:
        if not p.is_file():
            continue
        if p.stat().st_size == 0:
            raise SourceError(f"{p}: the file is empty ({what}); remove it from the inputs or fill it") from cause
        if p.suffix.lower() in (".jsonl", ".json"):
            rows = 0
            for _ in iter_jsonl(p):  # raises a SourceError naming the line, when a line is bad
                rows += 1
            if rows == 0:
                raise SourceError(f"{p}: no records (only blank lines) ({what}); remove it from the inputs "
                                  "or fill it") from cause


def iter_rows(ds, what: str, files: Sequence[Path] = ()) -> Iterator[tuple[int, dict]]:
    """(record index, row) from a datasets stream, read errors turned into SourceError.

    For a UTF-8 error the files are scanned to name the file and byte offset exactly.
    """
    it = iter(ds)
    i = 0
    while True:
        try:
            row = next(it)
        except StopIteration:
            return
        except UnicodeDecodeError as e:
            for p in files:
                if p.suffix.lower() in TEXT_SUFFIXES:
                    bad = first_invalid_utf8(p)
                    if bad is not None:
                        raise invalid_utf8_error(p, bad[0], line=bad[1], record=f"near record {i}",
                                                 reason=e.reason) from e
            raise SourceError(f"{what}: invalid UTF-8 near record {i}: {e}; re-encode the input as "
                              "UTF-8") from e
        except SourceError:
            raise
        except Exception as e:
            _raise_local_file_problem(files, what, e)
            raise SourceError(f"{what}: could not read past record {i}: {type(e).__name__}: {e}; "
                              "check that the file is valid and of the expected schema") from e
        yield i, row
        i += 1


def iter_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, record) of a JSON Lines file, read line by line; blank lines are passed over.

    Errors name the file and line: invalid UTF-8 (with its byte offset), malformed JSON, a line that
    is not a JSON object, and strings holding a lone surrogate escape (JSON allows them, UTF-8 cannot
    encode them).
    """
    import json

    try:
        f = open(path, "rb")
    except OSError as e:
        raise SourceError(f"{path}: cannot read this file ({e.strerror or e}); check that it exists "
                          "and is readable") from e
    with f:
        offset = 0
        for n, raw in enumerate(f, 1):
            start, offset = offset, offset + len(raw)
            if not raw.strip():
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise invalid_utf8_error(path, start + e.start, line=n, reason=e.reason) from e
            try:
                record = json.loads(line)
            except ValueError as e:
                raise SourceError(f"{path}, line {n}: not valid JSON ({e}); fix or remove this line") from e
            if not isinstance(record, dict):
                raise SourceError(f"{path}, line {n}: a JSON {type(record).__name__}, not an object; "
                                  "each line must be one {...} record")
            try:
                line.encode("utf-8")
                json.dumps(record, ensure_ascii=False).encode("utf-8")
            except UnicodeEncodeError as e:
                raise SourceError(f"{path}, line {n}: a lone surrogate escape ({e.object[e.start:e.end]!r}) "
                                  "that no UTF-8 text can hold; fix the escape in this record") from e
            yield n, record


def _kwargs_text(kwargs: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items() if v is not None) or "no options"
