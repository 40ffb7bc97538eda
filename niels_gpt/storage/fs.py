"""fsspec filesystems for URLs, and the one retry and time-limit path of every network wait.

- `filesystem(url, write=...)` -> (fs, root path); a missing backend names the extra that installs it,
  an unknown scheme lists the supported ones, `http(s)://` is refused for writing.
- `bounded_call(fs, method, ...)`: ended when nothing moved for the network time limit (no answer, or no
  byte of a transfer); a transfer that keeps moving is never cut. Async backends (s3, gs, http) are
  cancelled on a stall or Ctrl-C; sync ones (hf, memory, file) run on a helper thread.
- `with_retries(fn, what)`: transient errors retried with exponential backoff (RETRIES, BACKOFF_S); a
  stall, an unresolved host or an error retrying cannot help is one StorageError naming the address.
- `call(fs, what, method, ...)`: the two together, how every store call of the package is made.
- `read_bytes(fs, path, what)`: an object's bytes, fetched as a file so that its limit sees the bytes moving.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import functools
import os
import signal
import tempfile
import threading
import time

from niels_gpt.errors import ConfigError, NielsGPTError, StorageError
from niels_gpt.storage.settings import TIMEOUT_ENV, network_timeout_s

# scheme -> the extra of niels_gpt that installs its fsspec backend (None: fsspec itself has it)
SCHEMES = {
    "file": None, "memory": None,
    "s3": "s3", "s3a": "s3",
    "gs": "gcs", "gcs": "gcs",
    "hf": None,  # huggingface_hub comes with datasets
    "http": "http", "https": "http",
}
READ_ONLY = {"http", "https"}
RETRIES = 4
BACKOFF_S = 0.5
POLL_S = 0.05  # how often a bounded call looks at its progress
CANCEL_WAIT_S = 5.0  # how long a cancelled transfer may take to close its connection


def scheme_of(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else "file"


def filesystem(url: str, *, write: bool = False):
    """(fsspec filesystem, path inside it) for `url`; a clear ConfigError when it cannot be served."""
    scheme = scheme_of(url)
    if scheme not in SCHEMES:
        raise ConfigError(f"{url}: the URL scheme {scheme!r} is not supported; use one of "
                          f"{', '.join(s + '://' for s in sorted(SCHEMES))} or a local path")
    if write and scheme in READ_ONLY:
        raise ConfigError(f"{url}: {scheme}:// is read-only; write the cache to a local directory or to "
                          "s3://, gs://, hf://, memory://, and serve it over HTTP from there")
    extra = SCHEMES[scheme]
    try:
        import fsspec
    except ImportError as exc:
        raise ConfigError(f"{url}: reading or writing URLs needs fsspec: pip install "
                          f"'niels_gpt[{extra or 'cloud'}]'") from exc
    try:
        # NOTE: a backend may look for credentials here (gcsfs asks a cloud metadata server, ~16 s when
        # there is no network): bounded like any other wait
        fs, root = with_deadline(lambda: fsspec.core.url_to_fs(url, **_options(scheme)), network_timeout_s())
    except TimeoutError:
        raise StorageError(f"{url}: the {scheme}:// backend did not start within {network_timeout_s():g} s (it "
                           "looks for credentials and its endpoint first); check the network and the credentials, "
                           f"or raise the limit with --network-timeout SECONDS or {TIMEOUT_ENV}") from None
    except ImportError as exc:
        raise ConfigError(f"{url}: the {scheme}:// backend is not installed ({exc}); pip install "
                          f"'niels_gpt[{extra}]'") from exc
    return fs, root.rstrip("/") or root


def _options(scheme: str) -> dict:
    """NOTE: aiohttp's five-minute cap on a whole request would cut a slow transfer still moving; limit
    connecting and a stall instead (`sock_read` is what ends a stalled read of a file opened as a stream)."""
    if scheme not in ("http", "https"):
        return {}
    import aiohttp  # lazy: only for http(s) URLs

    limit = network_timeout_s()
    return {"client_kwargs": {"timeout": aiohttp.ClientTimeout(total=None, sock_connect=limit, sock_read=limit)}}


def join(root: str, rel: str) -> str:
    return f"{root.rstrip('/')}/{rel.lstrip('/')}" if rel else root


LOCAL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS}
NO_NAME = ("Name or service not known", "nodename nor servname", "Temporary failure in name resolution",
           "No address associated with hostname", "getaddrinfo failed")


def _unresolved(exc: BaseException) -> bool:
    """A host name that does not resolve (no network, or a wrong endpoint): retrying does not bring it back."""
    text = f"{type(exc).__name__}: {exc}"
    return "DNSError" in type(exc).__name__ or any(k in text for k in NO_NAME)


def _transient(exc: BaseException) -> bool:
    """Worth another try: the network or the server, not a missing file or a full local disk."""
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    if _unresolved(exc):
        return False
    status = getattr(exc, "status", None) or getattr(exc, "code", None)
    if isinstance(status, int) and status >= 400:
        return status >= 500 or status in (408, 429)
    if isinstance(exc, OSError) and exc.errno in LOCAL_ERRNOS:
        return False
    if isinstance(exc, (ConnectionError, TimeoutError, OSError)):
        return True
    name = type(exc).__name__
    return any(k in name for k in ("Timeout", "Connection", "Throttl", "ClientPayload", "ServerDisconnected"))


def described(exc: BaseException) -> str:
    """An error as a user reads it: `HTTP 503 Service Unavailable` for a server's answer, else `Type: text`."""
    status = getattr(exc, "status", None)
    if isinstance(status, int) and not isinstance(status, bool) and status >= 400:
        return f"HTTP {status} {getattr(exc, 'message', '') or ''}".rstrip()
    if isinstance(exc, TimeoutError):  # bounded_call's own says how long and after how many bytes
        text = str(exc)
        return text if text.startswith(("no answer", "no byte")) else \
            "no answer, or no byte of the transfer, within the time limit (the transfer stalled)"
    return f"{type(exc).__name__}: {exc}"


def with_deadline(fn, timeout_s: float, expired=None):
    """fn() on a helper thread, or TimeoutError (or `expired()`) when it has not returned within `timeout_s`.

    NOTE: a stalled body read slips past some backends' own limits; a thread covers every scheme. A call
    that times out keeps its daemon thread until the backend gives up; its result is dropped."""
    fut = _on_thread(fn)
    if not concurrent.futures.wait([fut], timeout=timeout_s).done:
        raise expired() if expired is not None else TimeoutError(f"no answer within {timeout_s:.3g} s")
    return fut.result()


def _on_thread(fn) -> concurrent.futures.Future:
    """fn() on a daemon thread; its result or exception in the Future."""
    fut: concurrent.futures.Future = concurrent.futures.Future()

    def work():
        try:
            fut.set_result(fn())
        except BaseException as exc:  # handed to the caller's thread
            fut.set_exception(exc)

    threading.Thread(target=work, name="niels-gpt-storage-call", daemon=True).start()
    return fut


_stopping = threading.Event()  # set by stop_transfers(): every bounded call still running ends at once


def stop_transfers() -> None:
    """End every transfer of this process now (Ctrl-C): each bounded call, on any thread, cancels and raises."""
    _stopping.set()


def transfers_stopped() -> bool:
    """Whether stop_transfers() ran: a wait for another thread's download (its lock) ends too."""
    return _stopping.is_set()


def _interrupted(signum, frame):
    stop_transfers()
    raise KeyboardInterrupt


def ctrl_c_stops_transfers():
    """Ctrl-C calls stop_transfers() before KeyboardInterrupt unwinds (main thread, default handler only);
    returns the function that undoes it."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return lambda: None
    previous = signal.signal(signal.SIGINT, _interrupted)
    return lambda: signal.signal(signal.SIGINT, previous)


@functools.cache
def _stop_at_exit() -> None:
    """Once per process: stop_transfers() at interpreter exit, before thread pools are joined.
    NOTE: threading's own exit hooks, which concurrent.futures joins from; ours is registered later, so runs first."""
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        with contextlib.suppress(RuntimeError):  # already shutting down
            register(stop_transfers)


def allow_transfers() -> None:
    """Undo stop_transfers(): what a command's start does (in-process callers run several)."""
    _stopping.clear()


def bounded_call(fs, method: str, *args, timeout_s: float | None = None, **kwargs):
    """`fs.<method>(*args, **kwargs)`, ended by TimeoutError when nothing has moved for `timeout_s` seconds
    (default `network_timeout_s()`; see the module docstring)."""
    limit = network_timeout_s() if timeout_s is None else timeout_s
    from fsspec.callbacks import Callback  # its `value` counts the bytes moved: slow, or stalled?

    _stop_at_exit()
    moved = Callback()
    if method in ("get_file", "put_file"):
        kwargs["callback"] = moved
    # NOTE: fsspec puts a sync wrapper of each async method on the instance (its __wrapped__ is the coroutine
    # function); any other function there was put by a caller (a test's fault injection) and runs as is
    on_instance = vars(fs).get(method)
    replaced = on_instance is not None and not hasattr(on_instance, "__wrapped__")
    ended = None  # an async attempt's end, which a stall or Ctrl-C waits for after cancelling it
    if getattr(fs, "async_impl", False) and not replaced:
        import asyncio

        ended = threading.Event()

        async def run():
            try:
                return await getattr(fs, "_" + method)(*args, **kwargs)
            finally:
                ended.set()

        fut = asyncio.run_coroutine_threadsafe(run(), fs.loop)
    else:
        fut = _on_thread(lambda: getattr(fs, method)(*args, **kwargs))
    seen, moved_at = 0, time.monotonic()
    try:
        while True:
            concurrent.futures.wait([fut], timeout=POLL_S)
            if fut.done():
                return fut.result()
            if _stopping.is_set():
                raise KeyboardInterrupt from None
            now = time.monotonic()
            if moved.value != seen:
                seen, moved_at = moved.value, now
            elif now - moved_at > limit:
                raise TimeoutError(f"no answer within {limit:g} s" if not seen else
                                   f"no byte for {limit:g} s after {seen:,} bytes (the transfer stalled)")
    except BaseException:  # a stall, or Ctrl-C: the attempt ends here, not later on its own
        if not fut.done() and ended is not None:
            fut.cancel()
            ended.wait(CANCEL_WAIT_S)
        raise


def with_retries(fn, what: str, *, retries: int | None = None, backoff_s: float | None = None,
                 timeout_s: float | None = None, started: float | None = None, bounded: bool = False):
    """Call fn(); retry transient storage errors; raise StorageError naming `what` when they persist.

    Unbounded: fn runs under `with_deadline`, and no attempt starts once `timeout_s` (default
    `network_timeout_s()`) has passed since `started` (default: now). `bounded`: fn is a `bounded_call`
    on this thread; its TimeoutError ends at once, other transient errors are retried `retries` times."""
    retries = RETRIES if retries is None else max(1, retries)  # at least the one attempt
    backoff_s = BACKOFF_S if backoff_s is None else backoff_s
    limit = network_timeout_s() if timeout_s is None else timeout_s
    t0 = time.monotonic() if started is None else started
    raise_limit = (f"raise the limit with --network-timeout SECONDS or {TIMEOUT_ENV} (now {limit:g} s)")
    for attempt in range(1, retries + 1):
        try:
            if bounded:
                return fn()
            left = limit - (time.monotonic() - t0)  # the first attempt gets what the filesystem's start left
            return with_deadline(fn, max(min(limit, 1.0), left) if attempt == 1 else limit)
        except (FileNotFoundError, NotImplementedError, NielsGPTError):
            raise  # the caller's to name: a missing marker, a store that cannot list, our own errors
        except Exception as exc:
            if _unresolved(exc):
                raise StorageError(f"{what}: the host's name does not resolve ({type(exc).__name__}: {exc}); no "
                                   "network, or a wrong endpoint: check both, then rerun") from exc
            if not _transient(exc):  # no credentials, access denied, a full local disk: retrying cannot help
                raise StorageError(f"{what}: {described(exc)}; check the credentials, the endpoint "
                                   "and the local disk, then rerun") from exc
            waited = time.monotonic() - t0
            if bounded and isinstance(exc, TimeoutError):
                raise StorageError(f"{what}: {described(exc)}; check the endpoint and the network, or {raise_limit}") from exc
            if attempt == retries or (not bounded and waited + backoff_s * 2 ** (attempt - 1) >= limit):
                raise StorageError(f"{what}: failed {attempt} time{'s' if attempt > 1 else ''} in {waited:.3g} s, last with "
                                   f"{described(exc)}; check the endpoint and the network, or "
                                   f"{raise_limit}") from exc
            if _stopping.wait(backoff_s * 2 ** (attempt - 1)):  # Ctrl-C ends the backoff too
                raise KeyboardInterrupt from None
    raise AssertionError("unreachable")


def call(fs, what: str, method: str, *args, **kwargs):
    """`fs.<method>(*args, **kwargs)` bounded by its stalls and retried; errors name `what`."""
    return with_retries(lambda: bounded_call(fs, method, *args, **kwargs), what, bounded=True)


def read_bytes(fs, path: str, what: str) -> bytes:
    """The bytes of the object at `path` (FileNotFoundError when there is none), fetched as a file: the time
    limit sees them moving, so a slow read of a large object is never cut (a `cat_file` would be, at the limit)."""
    fd, tmp = tempfile.mkstemp(prefix="niels_gpt_read_", suffix=f".tmp-{os.getpid()}")
    os.close(fd)
    try:
        call(fs, what, "get_file", path, tmp)
        with open(tmp, "rb") as f:
            return f.read()
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def longest_wait_s() -> float:
    """How long `with_retries` may take at most: what a process waiting on another's download allows it."""
    return RETRIES * network_timeout_s() + sum(BACKOFF_S * 2 ** k for k in range(RETRIES - 1))
