"""`datasets` streams (`load_dataset(id, name=config, split=split, streaming=True)`) whose failure to open,
or to read past a record, is a SourceError naming the dataset, its options and the record."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from niels_gpt.errors import SourceError


def open_stream(path_or_id: str, what: str, *, streaming: bool = True, **kwargs: Any):
    """datasets.load_dataset(...) with failures turned into SourceError naming what was opened."""
    from datasets import load_dataset

    try:
        return load_dataset(path_or_id, streaming=streaming, **kwargs)
    except Exception as e:  # the hub, fsspec and pyarrow raise many kinds; the message is what helps
        raise SourceError(f"{what}: cannot open {path_or_id!r} ({_kwargs_text(kwargs)}): "
                          f"{type(e).__name__}: {e}; check the dataset id/config and network, or download its "
                          "files and pass them instead") from e


def iter_rows(ds, what: str) -> Iterator[tuple[int, dict]]:
    """(record index, row) from a datasets stream, read errors turned into SourceError naming the record."""
    i = 0
    try:
        for row in ds:
            yield i, row
            i += 1
    except UnicodeDecodeError as e:
        raise SourceError(f"{what}: invalid UTF-8 near record {i}: {e}; re-encode the input as UTF-8") from e
    except SourceError:
        raise
    except Exception as e:
        raise SourceError(f"{what}: could not read past record {i}: {type(e).__name__}: {e}; "
                          "check that the dataset is valid and of the expected schema") from e


def _kwargs_text(kwargs: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items() if v is not None) or "no options"
