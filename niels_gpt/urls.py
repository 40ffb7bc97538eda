"""Is this string a URL? One rule for the whole package: `scheme://...`, never a Windows drive.

    is_url("s3://bucket/x") -> True       is_url("C:\\\\data") -> False       is_url("out/x") -> False
"""

from __future__ import annotations

import os
import re

from niels_gpt.errors import ConfigError

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+://")  # two or more characters: "C://x" is a drive


def is_url(path: str | os.PathLike) -> bool:
    return bool(_SCHEME.match(os.fspath(path))) if isinstance(path, (str, os.PathLike)) else False


def refuse_url(path, what: str) -> None:
    """Stop a command that writes local files from turning `s3://b/x` into a local `s3:/b/x` directory."""
    if is_url(path):
        raise ConfigError(f"{what} {os.fspath(path)!r} is a URL, but this writes local files only: give a local "
                          "directory (pack-sft OUT accepts fsspec URLs; upload other outputs with your storage tool)")
