"""Fetch numbered Parquet text shards from a base URL: parallel, retried, atomic, resumable.

- shard i is `<base_url>/shard_{i:05d}.parquet` (nanochat's fineweb-edu-100b-shuffle layout);
- N worker threads (downloads wait on the network, not the GIL), one shard each at a time;
- each attempt streams to `<name>.tmp-<pid>` in 1 MiB blocks, checks the byte count against
  Content-Length and the Parquet magic "PAR1" at both ends, then renames into place: a shard under
  its final name is complete, so a re-run skips it;
- failures (network errors, 5xx, 408/429, a truncated body) retry up to MAX_ATTEMPTS times with
  backoff BACKOFF_S * 2**(attempt-1); other 4xx answers fail at once (retrying cannot help);
- a tqdm bar counts shards (silent when stderr is not a terminal);
- Ctrl-C stops every transfer at once (their sockets are shut down, their temporaries removed), then the
  interrupt goes on to the caller: no worker keeps the process alive until its socket times out.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from niels_gpt.atomic import tmp_name
from niels_gpt.errors import ConfigError
from niels_gpt.urls import refuse_url

BASE_URL = "https://huggingface.co/datasets/karpathy/fineweb-edu-100b-shuffle/resolve/main"
FILENAME = "shard_{index:05d}.parquet"
NUM_WORKERS = 4
MAX_ATTEMPTS = 5
BACKOFF_S = 2.0
TIMEOUT_S = 30.0
BLOCK = 1 << 20
PARQUET_MAGIC = b"PAR1"
RETRY_STATUS = {408, 429}


@dataclass(frozen=True)
class ShardResult:
    index: int
    path: Path
    status: str  # "downloaded" | "skipped" | "failed"
    attempts: int = 0
    error: str = ""


class _Retryable(Exception):
    pass


class _Stopped(Exception):
    """The download was interrupted (Ctrl-C in the caller): the attempt ends without a retry."""


_stop = threading.Event()
_open_sockets: set = set()
_sockets_lock = threading.Lock()


def _socket_of(resp):
    # NOTE: http.client's response reads from a buffered socket.SocketIO; shutting the socket down is what
    # wakes a read blocked on a stalled server (closing it from another thread does not)
    return getattr(getattr(getattr(resp, "fp", None), "raw", None), "_sock", None)


def _interrupt() -> None:
    """End every transfer in progress now: the flag stops new attempts, the shutdown ends blocked reads."""
    _stop.set()
    with _sockets_lock:
        for sock in list(_open_sockets):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def _fetch_once(url: str, tmp: Path, timeout_s: float) -> None:
    import http.client
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp, open(tmp, "wb") as f:
            sock = _socket_of(resp)
            with _sockets_lock:
                _open_sockets.add(sock)
            try:
                expected = resp.headers.get("Content-Length")
                while not _stop.is_set() and (block := resp.read(BLOCK)):
                    f.write(block)
            finally:
                with _sockets_lock:
                    _open_sockets.discard(sock)
            if _stop.is_set():
                raise _Stopped
            f.flush()
            os.fsync(f.fileno())
    except urllib.error.HTTPError as exc:
        if exc.code >= 500 or exc.code in RETRY_STATUS:
            raise _Retryable(f"HTTP {exc.code} {exc.reason}") from exc
        raise  # 4xx: the shard is not there
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        if _stop.is_set():
            raise _Stopped from exc
        raise _Retryable(str(getattr(exc, "reason", exc))) from exc
    size = tmp.stat().st_size
    if expected is not None and size != int(expected):
        raise _Retryable(f"got {size} bytes, Content-Length says {expected} (truncated transfer)")
    with open(tmp, "rb") as f:
        head = f.read(4)
        f.seek(max(size - 4, 0))
        tail = f.read(4)
    if head != PARQUET_MAGIC or tail != PARQUET_MAGIC:
        raise _Retryable(f"{size} bytes that are not a Parquet file (no PAR1 magic at both ends)")


def download_shard(base_url: str, out_dir: str | os.PathLike, index: int, *, max_attempts: int = MAX_ATTEMPTS,
                   backoff_s: float = BACKOFF_S, timeout_s: float = TIMEOUT_S, filename: str = FILENAME) -> ShardResult:
    """Download one shard unless it is already complete; never raises for a failed transfer."""
    import urllib.error

    name = filename.format(index=index)
    final = Path(out_dir) / name
    if final.is_file():
        return ShardResult(index, final, "skipped")
    tmp = tmp_name(final)  # <name>.tmp-<pid>: ours, never a user's file of the same name
    url = f"{base_url.rstrip('/')}/{name}"
    error = ""
    for attempt in range(1, max_attempts + 1):
        try:
            if _stop.is_set():
                raise _Stopped
            _fetch_once(url, tmp, timeout_s)
            os.replace(tmp, final)
            return ShardResult(index, final, "downloaded", attempt)
        except _Stopped:
            tmp.unlink(missing_ok=True)
            return ShardResult(index, final, "failed", attempt, f"{url}: interrupted")
        except urllib.error.HTTPError as exc:
            tmp.unlink(missing_ok=True)
            return ShardResult(index, final, "failed", attempt, f"{url}: HTTP {exc.code} {exc.reason}")
        except _Retryable as exc:
            tmp.unlink(missing_ok=True)
            error = f"{url}: {exc}"
            if attempt < max_attempts and _stop.wait(backoff_s * 2 ** (attempt - 1)):
                return ShardResult(index, final, "failed", attempt, f"{url}: interrupted")
    return ShardResult(index, final, "failed", max_attempts, f"{error} (gave up after {max_attempts} attempts)")


def download_shards(base_url: str, out_dir: str | os.PathLike, indices, *, num_workers: int = NUM_WORKERS,
                    max_attempts: int = MAX_ATTEMPTS, backoff_s: float = BACKOFF_S, timeout_s: float = TIMEOUT_S,
                    filename: str = FILENAME, progress: bool | None = None) -> list[ShardResult]:
    """Download shards `indices` into out_dir with `num_workers` threads; results in index order.

    progress=None shows the bar only on a terminal.
    """
    from tqdm import tqdm

    refuse_url(out_dir, "--out-dir")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out-dir {out}: a file, not a directory; choose a directory for the shards")
    # NOTE: download only adds files: a shard already there (complete or a user's) is kept, never replaced
    out.mkdir(parents=True, exist_ok=True)
    indices = list(indices)
    results = {}
    _stop.clear()
    with ThreadPoolExecutor(max_workers=max(1, num_workers)) as pool, \
            tqdm(total=len(indices), unit="shard", desc="download", disable=None if progress is None else not progress) as bar:
        futures = [pool.submit(download_shard, base_url, out, i, max_attempts=max_attempts, backoff_s=backoff_s,
                               timeout_s=timeout_s, filename=filename) for i in indices]
        try:
            for fut in as_completed(futures):
                r = fut.result()
                results[r.index] = r
                bar.update(1)
        except BaseException:  # Ctrl-C: stop the transfers now, not when their sockets time out
            _interrupt()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return [results[i] for i in indices]
