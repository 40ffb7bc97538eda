"""meta.json: the commit marker (written last, atomically) and the record needed to trust a cache.

Every open checks sizes and token counts (`check_files`); `verify` checks every sha256; small files a
reader loads whole anyway (an SFT split's offsets) are hashed on open (`load_checked_npy`).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import numpy as np
import xxhash

from niels_gpt.atomic import TMP_SUFFIX, pid_alive, write_bytes_atomic
from niels_gpt.confine import confined_all
from niels_gpt.constants import META_NAME, TOKEN_DTYPES
from niels_gpt.errors import CacheError, CacheMismatchError, ConfigError, IncompleteCacheError
from niels_gpt.seals import seal_problem, sealed_bytes
from niels_gpt.staging import OLD_INFIX

FORMAT_VERSION = 1
# A zstd shard's record counts the tokens it decompresses to: its "bytes" are not tokens * itemsize.
COMPRESSED_SUFFIX = ".zst"

# The contract's fields ("each meta.json must include at least"), per kind of cache.
_COMMON = ("dataset_name", "dataset_config", "split_rule", "seed", "token_dtype",
           "tokenizer_sha256", "vocab_size", "special_token_ids")
REQUIRED_FIELDS: dict[str, tuple[str, ...]] = {
    "pretrain": _COMMON + ("totals", "shard_bytes", "files"),
    "sft": _COMMON + ("totals", "files"),
    "tokenizer": ("tokenizer_sha256", "vocab_size", "special_token_ids", "settings"),
}
REQUIRED_TOTALS: dict[str, tuple[str, ...]] = {
    "pretrain": ("train_tokens", "val_tokens"),
    "sft": ("train_examples", "val_examples"),
}


def numpy_dtype(token_dtype: str) -> np.dtype:
    """meta.json's "uint16-le" / "uint32-le" -> numpy dtype."""
    try:
        return TOKEN_DTYPES[token_dtype]
    except KeyError:
        raise CacheError(f"unknown token_dtype {token_dtype!r}; expected one of {sorted(TOKEN_DTYPES)}") from None


def meta_token_dtype(dtype: np.dtype) -> str:
    dtype = np.dtype(dtype)
    for name, dt in TOKEN_DTYPES.items():
        if dt == dtype:
            return name
    raise ConfigError(f"token dtype {dtype} is not supported; use uint16 or uint32")


def meta_path(path: str | os.PathLike) -> Path:
    path = Path(path)
    return path / META_NAME if path.is_dir() or path.suffix != ".json" else path


def write_meta(path: str, meta: dict) -> None:
    """Write meta.json atomically, sealed (niels_gpt/seals.py), keys sorted (byte-stable)."""
    write_bytes_atomic(meta_path(path), sealed_bytes(meta))


def read_meta(path: str, *, check_seal: bool = True) -> dict:
    """Read and schema-check a meta.json (or a directory's), and check its seal. `check_seal=False`: for
    `verify`, which reports a broken seal only where no more specific check names what changed."""
    mp = meta_path(path)
    if not mp.is_file():
        raise IncompleteCacheError(unfinished_build(mp.parent) or (
            f"no {META_NAME} in {mp.parent}: the build was interrupted or never ran; "
            "re-run build-all for this cache"
        ))
    try:
        data = mp.read_bytes()
        meta = json.loads(data.decode("utf-8"))
    except FileNotFoundError as exc:  # it was there a moment ago: the cache is being swapped by a rebuild
        raise IncompleteCacheError(f"{mp}: vanished while being read (a rebuild swapping the cache in?); "
                                   "open it again") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CacheError(f"{mp}: not valid JSON ({exc}); delete the cache and rebuild it") from exc
    if not isinstance(meta, dict):
        raise CacheError(f"{mp}: expected a JSON object, got {type(meta).__name__}")
    check_schema(meta, str(mp))  # first: its message names the field
    if check_seal:
        problem = meta_seal_problem(mp, data, meta)
        if problem is not None:
            raise CacheMismatchError(problem)
    return meta


def meta_seal_problem(mp: Path, data: bytes, meta: dict) -> str | None:
    """What is wrong with a meta.json against its own seal (niels_gpt/seals.py), or None."""
    fix = ("rebuild the cache" if meta.get("kind") != "tokenizer" else "retrain the tokenizer (train-tokenizer)") + \
        f" or put the original {META_NAME} back"
    return seal_problem(mp, data, meta, fix)


def check_schema(meta: dict, where: str) -> None:
    kind = meta.get("kind")
    if kind not in REQUIRED_FIELDS:
        raise CacheError(f"{where}: unknown kind {kind!r}; expected one of {sorted(REQUIRED_FIELDS)}")
    if meta.get("built") is False:
        return  # a placeholder for a source that was not built: nothing else is promised
    missing = [k for k in REQUIRED_FIELDS[kind] if k not in meta]
    missing += [f"totals.{k}" for k in REQUIRED_TOTALS.get(kind, ()) if k not in meta.get("totals", {})]
    if kind != "tokenizer":
        missing += [f"special_token_ids.{k}" for k in ("sys", "usr", "asst", "eot")
                    if k not in meta.get("special_token_ids", {})]
    if missing:
        raise CacheError(f"{where}: missing field(s) {', '.join(missing)}; the cache was written by "
                         "an incompatible version: rebuild it")
    if isinstance(meta.get("files"), dict):  # every reader joins these names to the cache directory
        confined_all(meta["files"], where, "files", fix="rebuild the cache")
    if kind != "tokenizer" and meta["token_dtype"] not in TOKEN_DTYPES:
        raise CacheError(f"{where}: token_dtype {meta['token_dtype']!r} is not one of {sorted(TOKEN_DTYPES)}")
    ids, vocab = meta["special_token_ids"], meta.get("vocab_size")
    if isinstance(vocab, int) and isinstance(ids, dict):
        bad = {k: v for k, v in ids.items() if v is not None and (not isinstance(v, int) or not 0 <= v < vocab)}
        known = [v for v in ids.values() if v is not None]
        if bad or len(set(known)) != len(known):
            raise CacheError(f"{where}: special_token_ids {ids} must be distinct ids below vocab_size {vocab}; "
                             "the meta.json was edited or damaged: rebuild the cache")
    sep = meta.get("document_separator")
    if isinstance(sep, dict) and isinstance(ids, dict) and "id" in sep:
        token = sep.get("token", "eot")
        # a BOS separator (prepended to each document) is recorded with the tokenizer, not among the chat ids
        expected = ids.get(token) if token != "bos" else (meta.get("tokenizer") or {}).get("bos_id")
        field = f"special_token_ids.{token}" if token != "bos" else "tokenizer.bos_id"
        if sep["id"] != expected:
            raise CacheError(f"{where}: document_separator.id {sep['id']!r} is not {field} ({expected!r}); the "
                             "meta.json was edited or damaged: rebuild the cache")


RECEIPT_HASH = "xxh3_128"  # a build task's receipt: what it read and wrote (sources/digests.py says why)


def receipt_hash(data: bytes = b""):
    """A new hash object of the receipts' algorithm, fed `data`."""
    return xxhash.xxh3_128(data)


def receipt_digest(data: bytes) -> str:
    """"xxh3_128:<hex>" of `data`: a receipt's digest of a byte range a task read."""
    return f"{RECEIPT_HASH}:" + receipt_hash(data).hexdigest()


def sha256_file(path: str, stop=None) -> str | None:
    """The hex sha256 of a file, read in 1 MiB blocks; None if the threading.Event `stop` is set meanwhile."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
            if stop is not None and stop.is_set():
                return None
    return h.hexdigest()


def file_record(path: str | os.PathLike, tokens: int | None, data: bytes | None = None) -> dict:
    """A written file's size, sha256 (of `data` when the caller holds the bytes, else read from disk) and
    token count where it holds tokens."""
    if data is not None:
        rec = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    else:
        rec = {"bytes": os.path.getsize(path), "sha256": sha256_file(path)}
    if tokens is not None:
        rec["tokens"] = int(tokens)
    return rec


def record_problem(rec) -> str | None:
    """What is wrong with one meta["files"] record, or None: bytes and sha256 always, tokens/examples when present."""
    if not isinstance(rec, dict):
        return f"is a {type(rec).__name__}, not an object with bytes and sha256"
    for key in ("bytes", "sha256"):
        if key not in rec:
            return f"has no {key!r} (keys: {sorted(rec)})"
    for key in ("bytes", "tokens", "examples"):
        if key in rec and (not isinstance(rec[key], int) or isinstance(rec[key], bool) or rec[key] < 0):
            return f"{key!r} is {rec[key]!r}, not a count"
    sha = rec["sha256"]
    if not isinstance(sha, str) or len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        return f"'sha256' is {sha!r}, not 64 hex digits"
    return None


def check_files(root: str | os.PathLike, meta: dict, *, hashes: bool = False,
                only: str | None = None) -> list[str]:
    """One line per disagreement between meta["files"] and the disk (every reader on open, and `verify`).

    Each record is well formed, each file has its recorded bytes, and a token count is exactly its bytes in
    the cache's dtype (readers index with it). `only`: files under that sub-directory; sha256 with `hashes`.
    """
    root = Path(root)
    problems = []
    files = meta.get("files", {})
    if not isinstance(files, dict):
        return [f"{root / META_NAME}: 'files' is a {type(files).__name__}, not an object; rebuild the cache"]
    dtype = TOKEN_DTYPES.get(meta.get("token_dtype"))
    itemsize = dtype.itemsize if dtype is not None else None
    for rel, rec in sorted(files.items()):
        if only is not None and not rel.startswith(only.rstrip("/") + "/") and rel != only:
            continue
        path = root / rel
        bad = record_problem(rec)
        if bad is not None:
            problems.append(f"{path}: its record in {META_NAME} {bad}; the meta.json was edited or damaged, "
                            "rebuild the cache")
            continue
        if "tokens" in rec and itemsize and rec["tokens"] * itemsize != rec["bytes"] and not rel.endswith(COMPRESSED_SUFFIX):
            problems.append(f"{path}: {META_NAME} says {rec['tokens']} tokens but {rec['bytes']} bytes of "
                            f"{meta['token_dtype']} ({rec['bytes'] // itemsize} tokens); the meta.json was edited "
                            "or damaged, rebuild the cache")
            continue
        problem = disk_problem(path, rec, "meta", hashes=hashes)
        if problem is not None:
            problems.append(problem)
    return problems


def disk_problem(path: Path, rec: dict, listed_in: str, *, hashes: bool = True, fix: str = "") -> str | None:
    """What differs between a file and its record ({"bytes", "sha256"}): missing, size, then (with `hashes`)
    sha256; or None. Caches' meta.json and every receipt use it."""
    if not path.is_file():
        return f"{path}: missing ({listed_in} lists {rec['bytes']} bytes)"
    size = path.stat().st_size
    if size != rec["bytes"]:
        return f"{path}: {size} bytes on disk, {listed_in} says {rec['bytes']} (truncated or overwritten){fix}"
    if hashes:
        digest = sha256_file(str(path))
        if digest != rec["sha256"]:
            return (f"{path}: sha256 {digest[:16]}… differs from {listed_in}'s {rec['sha256'][:16]}… (the file "
                    f"changed after it was written){fix}")
    return None


def stray_files_error(directory, names: list[str], root) -> CacheMismatchError:
    """The error for files in a cache directory that its meta.json does not list (readers and detection)."""
    return CacheMismatchError(f"{directory}: {', '.join(names)} not listed in {META_NAME} ({Path(root) / META_NAME}): "
                              "stray file(s) left over from another build? remove them or rebuild the cache")


def raise_on_problems(problems: list[str], root) -> None:
    if problems:
        raise CacheMismatchError(
            f"cache {root} disagrees with its {META_NAME}:\n  " + "\n  ".join(problems)
            + "\nrebuild it (build-all --only ...) or run `verify` for details"
        )


def load_checked_npy(path: str | os.PathLike, record: dict | None, what: str):
    """A small .npy file loaded whole, its bytes checked against `record`'s sha256 (none: unchecked, verify
    reports it); a damaged header is a CacheError, never numpy's own."""
    path = Path(path)
    data = path.read_bytes()
    expected = (record or {}).get("sha256")
    if isinstance(expected, str) and hashlib.sha256(data).hexdigest() != expected:
        raise CacheMismatchError(f"{path}: sha256 differs from meta.json ({what} changed after the build); "
                                 "rebuild the cache")
    try:
        return np.load(io.BytesIO(data), allow_pickle=False)
    except Exception as exc:  # numpy raises ValueError, SyntaxError or TokenError on a damaged header
        raise CacheError(f"{path}: not a numeric .npy {what} file ({type(exc).__name__}: {exc}); rebuild "
                         "the cache") from exc


def sft_offsets_problem(offsets, num_tokens: int | None) -> str | None:
    """What is wrong with an SFT cache's example offsets, or None (the reader, pack-sft, stats and `verify`).

    Example i is tokens[offsets[i]:offsets[i+1]] (the last runs to the end), so the offsets are 1-D
    integers from 0, strictly increasing, the last inside `num_tokens` (None: not checked)."""
    offsets = np.asarray(offsets)
    if offsets.ndim != 1 or offsets.dtype.kind not in "iu":
        return f"expected a 1-D integer offsets array, got {offsets.dtype} {offsets.shape}"
    if not len(offsets):
        return None
    if offsets[0] != 0:
        return f"first offset is {offsets[0]}, expected 0"
    steps = np.diff(offsets.astype(np.int64))
    if (steps <= 0).any():
        bad = int(np.flatnonzero(steps <= 0)[0]) + 1
        return f"offset {bad} ({offsets[bad]}) does not increase: empty or reordered example"
    if num_tokens is not None and offsets[-1] >= num_tokens:
        return (f"last offset {offsets[-1]} is not inside the token file ({num_tokens} tokens): the token file "
                "is truncated")
    return None


def check_sft_offsets(offsets, num_tokens: int, path) -> np.ndarray:
    """The offsets as int64, or a CacheError naming `path` and what is wrong (`sft_offsets_problem`)."""
    problem = sft_offsets_problem(offsets, num_tokens)
    if problem is not None:
        raise CacheError(f"{path}: {problem}; rebuild the cache")
    return np.asarray(offsets).astype(np.int64, copy=False)


def unfinished_build(out: str | os.PathLike) -> str | None:
    """Why `out` has no commit marker when a build of it was interrupted (or None), and how to finish it.

    A build writes `<out>.tmp-<pid>` and swaps it in (niels_gpt/staging.py): an interrupted first build
    leaves that directory, one killed between the swap's two renames `<out>.old-<pid>`.
    """
    out = Path(out)
    if not out.parent.is_dir() or (out / META_NAME).is_file():
        return None
    left = sorted(p for p in out.parent.iterdir() if p.is_dir() and staged_output(p) == out)
    if not left:
        return None
    running = [p for p in left if (m := TMP_SUFFIX.search(p.name)) and pid_alive(int(m.group(1)))]
    if running:
        return (f"{out}: a build of it is still running ({running[0].name} beside it has no {META_NAME} yet): "
                "wait for it to finish, then open it again")
    names = ", ".join(p.name for p in left)
    if out.parent.name in ("pretrain", "sft"):
        how = f"`build-all --cache-dir {out.parent.parent} --only {out.name}` with the flags it was started with"
    else:
        how = "the command that writes it, with the same flags"
    return (f"{out}: its build was interrupted before it finished (it left {names} beside it, and no {META_NAME}): "
            f"finish it by running {how}; the rerun cleans up what the interrupted one left")


def staged_output(path: str | os.PathLike) -> Path | None:
    """The output a build's staging directory (`<out>.tmp-<pid>`) or swapped-out copy (`<out>.old-<pid>`)
    belongs to, or None for any other path."""
    path = Path(path)
    m = TMP_SUFFIX.search(path.name)
    if m is not None:
        return path.with_name(path.name[:m.start()])
    head, sep, pid = path.name.rpartition(OLD_INFIX)
    return path.with_name(head) if sep and head and pid.isdigit() else None
