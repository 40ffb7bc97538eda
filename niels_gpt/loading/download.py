"""Fetch numbered Parquet text shards from a base URL: parallel, retried, atomic, resumable.

- shard i is `<base_url>/shard_{i:05d}.parquet` (nanochat's fineweb-edu-100b-shuffle layout); a Hugging Face
  Hub URL is read through `huggingface_hub`, any other through its fsspec backend;
- every transfer goes through the storage layer's one retry and time-limit path (`storage.fs`);
- each attempt writes `<name>.tmp-<pid>`, checks the Parquet magic at both ends and renames into place, so
  a shard under its final name is complete and a re-run skips it; Ctrl-C ends every transfer at once.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from niels_gpt.atomic import tmp_name
from niels_gpt.errors import ConfigError, StorageError
from niels_gpt.readers.checks import count
from niels_gpt.storage.fs import allow_transfers, bounded_call, filesystem, stop_transfers, with_retries
from niels_gpt.storage.settings import network_timeout_s
from niels_gpt.urls import refuse_url

BASE_URL = "https://huggingface.co/datasets/karpathy/fineweb-edu-100b-shuffle/resolve/main"
FILENAME = "shard_{index:05d}.parquet"
NUM_WORKERS = 4
MAX_ATTEMPTS = 5
BACKOFF_S = 2.0
PARQUET_MAGIC = b"PAR1"
HUB_HOSTS = ("huggingface.co", "hf.co")
HUB_READ = 1 << 20


@dataclass(frozen=True)
class ShardResult:
    index: int
    path: Path
    status: str  # "downloaded" | "skipped" | "failed"
    attempts: int = 0
    error: str = ""


class NotParquet(ConnectionError):
    """What arrived is not a whole Parquet file (an error page, a body cut short): worth another try."""


def hub_path(url: str) -> str | None:
    """The `hf://` path of a Hugging Face Hub file URL (`.../resolve/REVISION/PATH`), None for any other URL."""
    from huggingface_hub import constants  # lazy: only to learn the hub's endpoint

    parts = urlsplit(url)
    hosts = {*HUB_HOSTS, urlsplit(constants.ENDPOINT).hostname}
    words = parts.path.strip("/").split("/")
    if parts.scheme not in ("http", "https") or parts.hostname not in hosts or "resolve" not in words:
        return None
    at = words.index("resolve")
    repo, rest = words[:at], words[at + 1:]
    if len(repo) not in (2, 3) or (len(repo) == 3 and repo[0] not in ("datasets", "spaces")) or not rest:
        return None
    return f"hf://{'/'.join(repo)}@{rest[0]}" + "".join(f"/{w}" for w in rest[1:])


def _source(url: str):
    """(filesystem, path) of a shard's URL: a hub file as one streamed GET through huggingface_hub, read (and
    its moving bytes counted, so a slow transfer is told from a stall) a MiB at a time; else its fsspec backend."""
    hub = hub_path(url)
    if hub is None:
        return filesystem(url)
    from huggingface_hub import HfFileSystem  # lazy: only for hub URLs

    fs = HfFileSystem(block_size=0)  # streamed; fsspec keeps one instance per arguments: this one is download's
    fs.blocksize = HUB_READ  # what get_file reads, and reports as moved, at a time
    return fs, hub.removeprefix("hf://")


def _check_parquet(path: Path) -> None:
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(4)
        f.seek(max(size - 4, 0))
        tail = f.read(4)
    if head != PARQUET_MAGIC or tail != PARQUET_MAGIC:
        raise NotParquet(f"{size} bytes that are not a Parquet file (no PAR1 magic at both ends)")


def download_shard(base_url: str, out_dir: str | os.PathLike, index: int, *, max_attempts: int = MAX_ATTEMPTS,
                   backoff_s: float = BACKOFF_S, timeout_s: float | None = None,
                   filename: str = FILENAME) -> ShardResult:
    """Download one shard unless it is already complete; never raises for a failed transfer. `timeout_s`:
    the network time limit (None: `--network-timeout`)."""
    max_attempts = count("download", "max_attempts", max_attempts, what="a number of tries")  # 0: no try at all
    name = filename.format(index=index)
    final = Path(out_dir) / name
    if final.is_file():
        return ShardResult(index, final, "skipped")
    tmp = tmp_name(final)  # <name>.tmp-<pid>: ours, never a user's file of the same name
    url = f"{base_url.rstrip('/')}/{name}"
    limit = network_timeout_s() if timeout_s is None else timeout_s
    attempts = 0

    def attempt() -> None:
        nonlocal attempts
        attempts += 1
        fs, path = _source(url)
        try:
            bounded_call(fs, "get_file", path, os.fspath(tmp), timeout_s=limit)
            _check_parquet(tmp)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    try:
        with_retries(attempt, f"downloading {url}", retries=max_attempts, backoff_s=backoff_s, timeout_s=limit,
                     bounded=True)
        os.replace(tmp, final)
        return ShardResult(index, final, "downloaded", attempts)
    except FileNotFoundError:
        return ShardResult(index, final, "failed", attempts, f"{url}: HTTP 404, no such shard at this address; "
                                                             "check --base-url, --first and -n")
    except StorageError as exc:
        return ShardResult(index, final, "failed", attempts, str(exc))
    except KeyboardInterrupt:  # stop_transfers(): Ctrl-C in the caller
        return ShardResult(index, final, "failed", attempts, f"{url}: interrupted")
    finally:
        tmp.unlink(missing_ok=True)


def download_shards(base_url: str, out_dir: str | os.PathLike, indices, *, num_workers: int = NUM_WORKERS,
                    max_attempts: int = MAX_ATTEMPTS, backoff_s: float = BACKOFF_S, timeout_s: float | None = None,
                    filename: str = FILENAME, progress: bool | None = None) -> list[ShardResult]:
    """Download shards `indices` into out_dir with `num_workers` threads; results in index order (a progress
    bar on a terminal, unless `progress` says otherwise)."""
    from tqdm import tqdm

    refuse_url(out_dir, "--out-dir")
    count("download", "max_attempts", max_attempts, what="a number of tries")  # before the folder is made
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out-dir {out}: a file, not a directory; choose a directory for the shards")
    _source(f"{base_url.rstrip('/')}/{filename.format(index=0)}")  # an unknown scheme, a missing backend: one line
    # NOTE: download only adds files: a shard already there (complete or a user's) is kept, never replaced
    out.mkdir(parents=True, exist_ok=True)
    indices = list(indices)
    results = {}
    allow_transfers()
    with ThreadPoolExecutor(max_workers=max(1, num_workers)) as pool, \
            tqdm(total=len(indices), unit="shard", desc="download", disable=None if progress is None else not progress) as bar:
        futures = [pool.submit(download_shard, base_url, out, i, max_attempts=max_attempts, backoff_s=backoff_s,
                               timeout_s=timeout_s, filename=filename) for i in indices]
        try:
            for fut in as_completed(futures):
                r = fut.result()
                results[r.index] = r
                bar.update(1)
        except BaseException:  # Ctrl-C: the transfers end now, their connections closed, not when they stall out
            stop_transfers()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return [results[i] for i in indices]
