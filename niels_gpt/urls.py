"""Is this string a URL? One rule for the whole package: `scheme://...`, never a Windows drive.

    is_url("s3://bucket/x") -> True       is_url("C:\\\\data") -> False       is_url("out/x") -> False
"""

from __future__ import annotations

import os
import re

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+://")  # two or more characters: "C://x" is a drive


def is_url(path: str | os.PathLike) -> bool:
    return bool(_SCHEME.match(os.fspath(path))) if isinstance(path, (str, os.PathLike)) else False
