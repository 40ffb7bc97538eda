"""The one rule for a name read from a record: it stays inside its directory.

A file name a record holds (meta.json's `files`, a manifest's, a receipt's, a pin file's, a task id) becomes
a path when joined to a directory, and a record may come from anywhere, so a name is accepted only as
`/`-separated components, none empty, `.` or `..`; not absolute, no backslash, control character or drive;
at most `parts` components; matching `pattern` where given. Anything else refuses the whole record.
"""

from __future__ import annotations

import re

from niels_gpt.errors import CacheError, NielsGPTError

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def name_problem(name, *, parts: int | None = None, pattern: str | None = None) -> str | None:
    """What is wrong with `name` as a name inside its directory, or None when it is a plain relative name."""
    if not isinstance(name, str):
        return f"is a {type(name).__name__}, not a string"
    if not name:
        return "is empty"
    if "\\" in name:
        return "holds a backslash"
    if _CONTROL.search(name):
        return "holds a control character"
    if name.startswith("/"):
        return "is an absolute path"
    if re.match(r"[A-Za-z]:", name):
        return "names a drive"
    comps = name.split("/")
    if any(c == "" for c in comps):
        return "has an empty component (a doubled or trailing '/')"
    if any(c in (".", "..") for c in comps):
        return "holds a '.' or '..' component"
    if parts is not None and len(comps) > parts:
        return "holds a '/' where a plain file name belongs" if parts == 1 else \
            f"has {len(comps)} components, at most {parts} belong here"
    if pattern is not None and not re.fullmatch(pattern, name):
        return f"is not of the form {pattern}"
    return None


def confined(name, record, field: str, *, parts: int | None = None, pattern: str | None = None,
             error: type[NielsGPTError] = CacheError, fix: str = "rebuild it, or get it from a source you trust"):
    """`name` when it is a plain relative name (the module docstring), else `error` naming `record` (the
    record file or URL), `field` and the name: the record is refused as a whole."""
    problem = name_problem(name, parts=parts, pattern=pattern)
    if problem is not None:
        raise error(f"{record}: {field} {name!r} is not a plain relative name inside its directory (it {problem}); "
                    f"the record was damaged or made to reach outside its directory, so none of it is used: {fix}")
    return name


def confined_all(names, record, field: str, **kw) -> None:
    """`confined` for each of `names` (e.g. the keys of a record's `files`)."""
    for name in names:
        confined(name, record, field, **kw)
