"""What a user names as input: files, directories, globs, URLs and Hugging Face dataset ids, expanded in order.

- A file of a known kind (`SUFFIXES`); a directory stands for its files of those kinds (recursively, sorted
  by relative path, dot-files out); a glob for its matches, sorted. `file://` is a local path.
- A URL (niels_gpt.storage.fs) is read through fsspec; on a scheme that can list (not http) a prefix and a
  glob stand for their files like a local directory and glob.
- Anything else that does not exist locally and looks like `owner/name` is a Hugging Face dataset id.
- `signature(path)` is taken when a build plans and again when it has read the file: a file rewritten
  meanwhile is refused (an edit changes its ctime even when its size and mtime are put back).
"""

from __future__ import annotations

import glob as globlib
import hashlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from niels_gpt.errors import SourceError
from niels_gpt.sources.text_io import files_under
from niels_gpt.storage.fs import filesystem, scheme_of, with_retries
from niels_gpt.storage.settings import network_timeout_s
from niels_gpt.storage.upload import local_path_of
from niels_gpt.urls import is_url

PLAIN_TEXT = (".txt", ".md", ".raw")
COMPRESSED_TEXT = (".txt.gz", ".txt.zst", ".md.gz", ".md.zst", ".raw.gz", ".raw.zst")  # read like their plain kinds
WHOLE_FILE = PLAIN_TEXT + COMPRESSED_TEXT
LINES = (".jsonl", ".json", ".jsonl.gz", ".json.gz", ".jsonl.zst", ".json.zst")
COLUMNAR = (".parquet", ".csv", ".arrow")
SUFFIXES = WHOLE_FILE + LINES + COLUMNAR
GLOB_CHARS = "*?["
UNLISTABLE = ("http", "https")  # fsspec's http "listing" scrapes HTML pages: refused, give file URLs
EDGE_BYTES = 4096  # bytes hashed at each end of a file for its signature
VAL_PIECE_CHARS = 4096  # --val-per-input: documents are cut into pieces of at least this many characters
# --read-as SUFFIX=KIND: the kinds a file of any other suffix can be read as
READ_AS_KINDS = {"text": ".txt", "jsonl": ".jsonl", "json": ".json", "csv": ".csv", "parquet": ".parquet",
                 "arrow": ".arrow"}
HOW_TO_READ = "to read it, pass --read-as {suffix}=text (or jsonl, csv, ...), or --format text to read every file as text"


@dataclass(frozen=True)
class ReadAs:
    """A local file of a suffix the library does not know, read as `kind` (--read-as, or --format text)."""

    path: Path
    kind: str

    def __fspath__(self) -> str:
        return os.fspath(self.path)

    def __str__(self) -> str:
        return str(self.path)

    @property
    def name(self) -> str:
        return self.path.name


def check_read_as(read_as: dict[str, str] | None) -> dict[str, str]:
    """--read-as's map, suffixes lower-cased with their dot; an unknown kind or a bare name is refused."""
    out = {}
    for suffix, kind in (read_as or {}).items():
        if not suffix.startswith(".") or len(suffix) < 2 or "/" in suffix:
            raise SourceError(f"--read-as {suffix}={kind}: the suffix must start with a dot, e.g. --read-as .dict=text")
        if kind not in READ_AS_KINDS:
            raise SourceError(f"--read-as {suffix}={kind}: unknown kind {kind!r}; use one of "
                              f"{', '.join(READ_AS_KINDS)}")
        out[suffix.lower()] = kind
    return out


def _suffix(name: str) -> str:
    """The suffix --read-as matches: `.dict` of `gcide.dict`, `.dict.gz` of `a.dict.gz`'s last two when named."""
    parts = name.lower().split(".")
    return "." + parts[-1] if len(parts) > 1 else ""


def read_as_kind(name: str, read_as: dict[str, str], as_text: bool) -> str | None:
    """The kind a file of an unknown suffix is read as (the longest --read-as suffix it ends with; else
    `.txt` with --format text), or None: left out."""
    low = name.lower()
    for suffix in sorted(read_as, key=len, reverse=True):
        if low.endswith(suffix) and low != suffix:
            return READ_AS_KINDS[read_as[suffix]]
    return ".txt" if as_text else None


def left_out_reason(name: str) -> str:
    suffix = _suffix(name)
    what = f"unknown file kind {suffix!r}" if suffix else "no file suffix"
    return f"{what}; " + HOW_TO_READ.format(suffix=suffix or "SUFFIX")


@dataclass(frozen=True)
class RemoteFile:
    """One input file at a URL (read through fsspec); `size` in bytes when the server told it."""

    url: str
    size: int | None = None

    def __str__(self) -> str:  # how errors and meta.json name it
        return self.url

    @property
    def name(self) -> str:
        return self.url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]


def kind_of(path: Path | RemoteFile | ReadAs | str) -> str | None:
    """The known suffix a file name ends with (longest first: `.jsonl.gz` before `.gz`), or None."""
    if isinstance(path, ReadAs):
        return path.kind
    name = (path.name if not isinstance(path, str) else Path(path).name).lower()
    return next((s for s in sorted(SUFFIXES, key=len, reverse=True) if name.endswith(s)), None)


def is_hf_id(spec: str) -> bool:
    parts = spec.split("/")
    return len(parts) == 2 and all(parts) and not any(c in spec for c in GLOB_CHARS) and kind_of(Path(spec)) is None


def _sized(info: dict) -> int | None:
    size = info.get("size")
    return size if isinstance(size, int) and size >= 0 else None


def ask(fn, url: str, what: str, started: float | None = None, *, bounded: bool = False):
    """A storage call about `url` (storage.fs.with_retries); a missing or forbidden object is a SourceError."""
    try:
        return with_retries(fn, f"{what} {url}", started=started, bounded=bounded)
    except FileNotFoundError:
        unreachable = _unreachable(url)
        if unreachable:
            raise SourceError(unreachable) from None
        raise SourceError(f"{url}: no such file or directory at this URL; check the URL (and the endpoint and "
                          "credentials of its storage)") from None
    except PermissionError as exc:
        raise SourceError(f"{url}: access denied ({exc}); check the credentials of its storage") from None


def _unreachable(url: str, timeout_s: float = 5.0) -> str | None:
    """Why an http(s) URL's server cannot be reached, or None.
    NOTE: fsspec's http backend reports a refused connection as a missing file."""
    import socket
    from urllib.parse import urlsplit

    if scheme_of(url) not in UNLISTABLE:
        return None
    parts = urlsplit(url)
    host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    if not host:
        return None
    try:
        with socket.create_connection((host, port), timeout=min(timeout_s, network_timeout_s())):
            return None
    except OSError as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc)).lower()
        return (f"{url}: cannot connect to {host}:{port} ({why}); the server is not answering: check the address "
                "and that the server runs")


def expand_url(url: str, left_out: list[dict]) -> list[RemoteFile]:
    """The files a URL stands for: itself, a prefix's files (recursively) or a glob's matches, sorted; the
    files of a prefix or glob that are not read are appended to `left_out`."""
    started = time.monotonic()
    fs, path = filesystem(url)  # an unknown scheme, or one whose backend is missing: a ConfigError naming the extra
    scheme = scheme_of(url)
    head, _, rest = url.partition("://")
    parts = rest.split("/")
    first_glob = next((k for k, part in enumerate(parts) if any(c in part for c in GLOB_CHARS)), None)
    if first_glob is not None and scheme not in UNLISTABLE:  # on http, "?" starts a query string
        base_url = f"{head}://" + "/".join(parts[:first_glob])
        base = fs._strip_protocol(base_url).rstrip("/")
        listed = ask(lambda: fs.glob(path, detail=True), url, "listing", started)
        empty = f"{url}: this glob matches no file of a known kind ({', '.join(SUFFIXES)})"
    else:
        info = ask(lambda: fs.info(path), url, "reading", started)
        if info.get("type") != "directory":
            if kind_of(RemoteFile(url)) is None:
                raise SourceError(f"{url}: unknown file kind; known: {', '.join(SUFFIXES)}")
            return [RemoteFile(url, _sized(info))]
        if scheme in UNLISTABLE:
            raise SourceError(f"{url}: {scheme}:// cannot list a directory; give the URL of each file")
        base_url, base, first_glob = url, path, None
        listed = ask(lambda: fs.find(path, detail=True), url, "listing")
        empty = f"{url}: no files of a known kind under this URL (known: {', '.join(SUFFIXES)})"
    found = []
    for p, finfo in listed.items():
        if finfo.get("type") == "directory":
            continue
        rel = PurePosixPath(p[len(base):].lstrip("/") if p.startswith(base) else p)
        f = RemoteFile(f"{base_url.rstrip('/')}/{rel.as_posix()}", _sized(finfo))
        named = rel if first_glob is None else PurePosixPath(rel.name)  # a glob's hidden matches: their own name
        hidden = any(s.startswith(".") for s in named.parts)
        if kind_of(f) and not hidden:
            # NOTE: a prefix's files in relative-path order, like a local directory's; a glob's like a local glob's
            found.append((rel.as_posix() if first_glob is None else rel, f))
        elif hidden:
            _leave_out(left_out, f.url, "a hidden file (its name starts with a dot); give its URL to read it")
        else:
            _leave_out(left_out, f.url, f"unknown file kind {_suffix(f.name)!r}; known: {', '.join(SUFFIXES)}")
    if not found:
        raise SourceError(empty)
    return [f for _, f in sorted(found, key=lambda pf: pf[0])]


def _local(p: Path) -> bool:
    """A glob's match of a known kind: a file, or a dangling link (so that reading it names it, as in a directory)."""
    try:
        return (p.is_file() or p.is_symlink() and not p.exists()) and kind_of(p) is not None
    except OSError:  # a symlink loop below a directory: named when it is read
        return True


def files_of(directory: Path, read_as: dict[str, str], as_text: bool, left_out: list[dict]) -> list[Path | ReadAs]:
    """The files under `directory` a build reads, sorted by relative path; the others (hidden files and
    directories, one entry each; unknown kinds) are appended to `left_out` as {"path", "reason"}."""
    hidden: set[str] = set()
    found: list[Path | ReadAs] = []
    for f in files_under(directory, lambda f: True, hidden=True):
        parts = f.relative_to(directory).parts
        dot = next((k for k, part in enumerate(parts) if part.startswith(".")), None)
        if dot is not None:
            top = directory.joinpath(*parts[:dot + 1])
            if str(top) not in hidden:
                hidden.add(str(top))
                what = "a hidden directory" if dot < len(parts) - 1 else "a hidden file"
                _leave_out(left_out, top, f"{what} (its name starts with a dot); name it as an input to read it")
            continue
        if kind_of(f) is not None:  # a dangling link too, so that reading it names it
            found.append(f)
        elif (kind := read_as_kind(f.name, read_as, as_text)) is not None:
            found.append(ReadAs(f, kind))
        else:
            _leave_out(left_out, f, left_out_reason(f.name))
    return found


def _leave_out(left_out: list[dict], path: Path | str, reason: str) -> None:
    left_out.append({"path": str(path), "reason": reason})


def expand(specs: Sequence[str | os.PathLike], *, read_as: dict[str, str] | None = None, as_text: bool = False,
           left_out: list[dict]) -> list[Path | RemoteFile | ReadAs | str]:
    """Local files (directories and globs expanded), files at URLs and dataset ids, in the order given.
    `read_as` (--read-as) and `as_text` (--format text) read files of other suffixes; the files of a
    directory or glob that are not read are appended to `left_out`."""
    read_as = check_read_as(read_as)
    out: list[Path | RemoteFile | ReadAs | str] = []
    for spec in specs:
        text = os.fspath(spec)
        if is_url(text):
            local = local_path_of(text)  # file:// is read as the local path it names
            if local is None:
                out.extend(expand_url(text, left_out))
                continue
            text = local
        p = Path(text)
        try:
            is_dir, is_file = p.is_dir(), p.is_file()
        except OSError as exc:  # ELOOP: a symlink that points back at itself
            raise SourceError(f"{p}: cannot be followed ({exc.strerror}); a symlink loop? point at the files "
                              "themselves") from None
        if is_dir:
            mine: list[dict] = []
            found = files_of(p, read_as, as_text, mine)
            if not found:
                unknown = sorted({_suffix(Path(d["path"]).name) for d in mine if "unknown" in d["reason"]})
                raise SourceError(f"{p}: no files of a known kind in this directory (known: {', '.join(SUFFIXES)})"
                                  + (f"; it holds {', '.join(unknown)} files: "
                                     + HOW_TO_READ.format(suffix=unknown[0]) if unknown else ""))
            out.extend(found)
            left_out.extend(mine)
        elif is_file:
            if kind_of(p) is not None:
                out.append(p)
            elif (kind := read_as_kind(p.name, read_as, as_text)) is not None:
                out.append(ReadAs(p, kind))
            else:
                raise SourceError(f"{p}: unknown file kind; known: {', '.join(SUFFIXES)}; "
                                  + HOW_TO_READ.format(suffix=_suffix(p.name) or "SUFFIX"))
        elif any(c in text for c in GLOB_CHARS):
            found = []
            for f in sorted(Path(f) for f in globlib.glob(text, recursive=True)):
                if _local(f):
                    found.append(f)
                elif f.is_dir():
                    continue
                elif (kind := read_as_kind(f.name, read_as, as_text)) is not None:
                    found.append(ReadAs(f, kind))
                else:
                    _leave_out(left_out, f, left_out_reason(f.name))
            if not found:
                raise SourceError(f"{text}: this glob matches no file of a known kind ({', '.join(SUFFIXES)})")
            out.extend(found)
        elif p.is_symlink():
            raise SourceError(f"{p}: a symlink to nothing (its target is missing, or it loops back on itself); "
                              "point at the files themselves")
        elif is_hf_id(text):
            out.append(text)
        else:
            raise SourceError(f"{text}: no such file or directory, and not a Hugging Face dataset id (owner/name)")
    return out


def signature(path: str | os.PathLike) -> list:
    """[size, mtime_ns, ctime_ns, inode, sha256 of the first and last EDGE_BYTES] of a local file."""
    st = os.stat(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(EDGE_BYTES))
        if st.st_size > EDGE_BYTES:
            f.seek(max(st.st_size - EDGE_BYTES, EDGE_BYTES))
            h.update(f.read(EDGE_BYTES))
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, h.hexdigest()]


def check_unchanged_file(path: str | os.PathLike, before: list | None) -> None:
    """Refuse `path` if it no longer has the signature `before`, taken before it was read (None: none taken)."""
    if before is None:
        return
    try:
        now = signature(path)
    except OSError as exc:
        raise SourceError(f"{path}: disappeared while it was read ({exc.strerror}); the build is refused: "
                          "rerun when the input is in place") from None
    if now == before:
        return
    what = ("its size" if now[0] != before[0] else "its modification time" if now[1] != before[1]
            else "its contents" if now[4] != before[4] else "its inode (replaced)" if now[3] != before[3]
            else "its status (written to)")
    raise SourceError(f"{path}: changed while it was read ({what} changed), so the cache would mix old and new "
                      "text; the build is refused: rerun when nothing writes to the input")


def val_pieces(text: str, chars: int = VAL_PIECE_CHARS) -> list[str]:
    """`text` cut just after blank lines into pieces of at least `chars` characters (--val-per-input), so
    --val-frac's draw sends pieces of every long input to val; joined, the pieces are `text`:

        "a"*5000 + "\n\n" + "b"*10 + "\n\n" + "c"*5000  ->  ["a"*5000 + "\n\n", "b"*10 + "\n\n" + "c"*5000]

    A last piece of only whitespace stays with the one before it."""
    out, start = [], 0
    while (cut := text.find("\n\n", start + chars)) >= 0:
        out.append(text[start:cut + 2])
        start = cut + 2
    rest = text[start:]
    if out and (not rest or rest.isspace()):
        out[-1] += rest
    else:
        out.append(rest)
    return out
