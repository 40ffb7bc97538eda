"""Where tasks run: this process, local processes, or a Ray cluster. None of them decides any byte.

An executor takes tasks (`tasks.run_task` and JSON-able arguments) and reports each one's receipt or error as
it ends, in any order; the driver commits in plan order, so the cache is the same on every executor.
- `inprocess`: one task after another in this process (the reference path, for tests);
- `processes`: a pool of local processes (forked where possible; each dies with the driver on Linux);
- `ray`: `ray.init(address=...)` ("auto", "HOST:PORT", or "local" for a private cluster of `workers` CPUs);
  `retries` retries of a task whose worker died. Every node needs this package, and the tokenizer and work
  directory at the same paths, or a work directory at a URL (storage/work.py).
"""

from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool

from niels_gpt.builders.encode_pool import worker_init
from niels_gpt.errors import CacheError, ConfigError
from niels_gpt.storage.fs import with_deadline

EXECUTORS = ("inline", "processes", "ray")  # and "inprocess": the task path without a pool (tests)
RAY_ADDRESS = "auto"
RETRIES = 2
CANCEL_WAIT_S = 60  # how long a failed or finished build waits for its cancelled Ray tasks to end
CONNECT_TIMEOUT_S = 30.0  # joining a Ray cluster, and its answer to each probe while tasks run (--connect-timeout)
PROBE_S = 5.0  # while Ray tasks run and none ends: how often the cluster is asked whether it still answers


class WorkerDied(Exception):
    """A task's process ended without a result (killed, out of memory, node lost)."""


class Executor:
    """submit(key, fn, *args) starts fn(*args); wait() blocks until at least one task ends and gives (key,
    result, error) for each that did; cancel() drops every task not yet finished."""

    name = "abstract"
    workers = 1

    @property
    def window(self) -> int:
        """Tasks to keep submitted at once: one queued behind each running task."""
        return 2 * self.workers

    def close(self) -> None:
        return None

    def describe(self) -> str:
        return f"{self.name} ({self.workers} worker{'s' if self.workers != 1 else ''})"


class InProcess(Executor):
    name = "inprocess"

    def __init__(self):
        self.queue: list = []

    def submit(self, key, fn, *args):
        self.queue.append((key, fn, args))

    def wait(self):
        key, fn, args = self.queue.pop(0)
        try:
            return [(key, fn(*args), None)]
        except Exception as e:
            return [(key, None, e)]

    def cancel(self):
        self.queue.clear()


class Processes(Executor):
    name = "processes"

    def __init__(self, workers: int | None = None):
        self.workers = workers or os.cpu_count() or 1
        if self.workers < 1:
            raise ConfigError(f"workers must be >= 1, got {workers}")
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        self.pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context(method),
                                        initializer=worker_init, initargs=(os.getpid(),))
        if method == "fork":  # every worker forked now, before the driver starts a thread of its own
            self.pool.submit(int)
        self.futures: dict = {}
        self.running = False

    def submit(self, key, fn, *args):
        try:
            future = self.pool.submit(fn, *args)
        except BrokenProcessPool as e:  # a worker died before this task could be queued: report it as failed
            future = Future()
            future.set_exception(e)
        self.futures[future] = key

    def wait(self):
        done, _ = wait(list(self.futures), return_when=FIRST_COMPLETED)
        out = []
        for f in done:
            key = self.futures.pop(f)
            try:
                out.append((key, f.result(), None))
            except Exception as e:
                if isinstance(e, BrokenProcessPool):
                    e = WorkerDied(f"a worker process died ({e})")
                out.append((key, None, e))
        return out

    def cancel(self):
        for f in self.futures:
            f.cancel()
        self.running = any(not f.done() for f in self.futures)
        self.futures.clear()

    def close(self):
        # a task still running may write into the work directory: wait for it; idle workers exit in the background
        self.pool.shutdown(wait=self.running or bool(self.futures), cancel_futures=True)


class Ray(Executor):
    name = "ray"

    def __init__(self, workers: int | None = None, address: str = RAY_ADDRESS, retries: int = RETRIES,
                 timeout: float | None = None):
        try:
            import ray
        except ImportError as e:
            raise ConfigError("--executor ray needs Ray: pip install 'niels_gpt[ray]' (or `pip install ray`) "
                              "on every node") from e
        self.ray = ray
        self.started = self.lost = False
        self.timeout = timeout = CONNECT_TIMEOUT_S if timeout is None else timeout
        self.address = "this build's local Ray cluster" if address == "local" else f"the Ray cluster at {address}"
        self._no_node_since: float | None = None
        fix = ("start one with `ray start --head`, pass its HOST:PORT with --ray-address, or use --ray-address local "
               "for a one-machine cluster")
        if not ray.is_initialized():
            kwargs: dict = {"log_to_driver": False, "configure_logging": False}
            if address == "local":
                kwargs.update(address="local", num_cpus=workers or os.cpu_count() or 1, include_dashboard=False)
            else:
                kwargs["address"] = address
                _reachable(address, timeout, fix)
            try:
                if address == "local":  # a cluster of our own, started here: nothing to wait on but ourselves
                    ray.init(**kwargs)
                else:  # NOTE: a thread only to bound the wait; a local cluster must start on the main thread
                    what = f"joining the Ray cluster at {address!r}"
                    with_deadline(lambda: ray.init(**kwargs), timeout, expired=lambda: ConfigError(
                        f"{what}: no answer within {timeout:g} s; {fix}; raise the limit with --connect-timeout"))
            except ConfigError:  # the deadline's own line (a ConfigError is a ValueError): said once, as is
                raise
            except (ConnectionError, RuntimeError, ValueError) as e:
                first = str(e).strip().splitlines()[0] if str(e).strip() else ""
                raise ConfigError(f"cannot join the Ray cluster at {address!r} ({type(e).__name__}: {first}); {fix}; "
                                  "a cluster with token authentication (Ray 2.60 local clusters) also needs "
                                  "RAY_AUTH_MODE=token and its token (~/.ray/auth_token or RAY_AUTH_TOKEN) on this "
                                  "machine") from e
            self.started = True
        self.cpus = int(ray.cluster_resources().get("CPU", 1))
        self.workers = workers or self.cpus
        self.retries = retries
        self.refs: dict = {}
        self._remote: dict = {}

    @property
    def window(self) -> int:
        # NOTE: Ray runs a submitted task as soon as a CPU is free: with fewer workers than CPUs, `workers` caps
        # what runs; with a worker per CPU, one more task per worker waits in Ray's queue, to start the moment
        # a task ends instead of after a round trip to this driver
        return 2 * self.workers if self.workers >= self.cpus else self.workers

    def submit(self, key, fn, *args):
        remote = self._remote.get(fn)
        if remote is None:
            remote = self._remote[fn] = self.ray.remote(num_cpus=1, max_retries=self.retries)(fn)
        self.refs[remote.remote(*args)] = key

    def wait(self):
        ray = self.ray
        while not (ready := ray.wait(list(self.refs), num_returns=1, timeout=PROBE_S)[0]):
            self._probe()
        out = []
        for ref in ready:
            key = self.refs.pop(ref)
            try:
                out.append((key, ray.get(ref), None))
            except ray.exceptions.RayTaskError as e:
                cause = getattr(e, "cause", None)
                out.append((key, None, cause if isinstance(cause, Exception) else e))
            except ray.exceptions.RayError as e:  # a dead worker or node, a cancelled task
                out.append((key, None, WorkerDied(f"{type(e).__name__}: {str(e).splitlines()[0]}")))
        return out

    def _probe(self) -> None:
        """No task ended for PROBE_S: the cluster must answer within the limit and have a live node with a CPU
        (within the limit too), else the build ends in one line naming it (its finished tasks are kept)."""
        t = self.timeout
        hint = (f"while {len(self.refs)} task(s) ran; the finished tasks are kept: run the same command again to "
                "resume once it is back (--connect-timeout sets this limit)")

        def gone(why: str) -> CacheError:
            self.lost = True  # nothing more is asked of it: cancelling or shutting down would wait on it too
            return CacheError(f"lost {self.address}: {why} {hint}")

        nodes = with_deadline(self.ray.nodes, t, expired=lambda: gone(f"no answer within {t:g} s"))
        if any(n.get("Alive") and (n.get("Resources") or {}).get("CPU") for n in nodes):
            self._no_node_since = None
            return
        self._no_node_since = self._no_node_since or time.monotonic()
        if time.monotonic() - self._no_node_since > t:
            raise gone(f"no live node with a CPU for {t:g} s")

    def cancel(self):
        if self.lost:
            self.refs.clear()
            return
        refs = list(self.refs)
        for ref in refs:
            try:
                self.ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 (a task that finished meanwhile cannot be cancelled)
                pass
        if refs:  # cancelling is asynchronous: wait until no task of this build is still writing
            self.ray.wait(refs, num_returns=len(refs), timeout=CANCEL_WAIT_S)
        self.refs.clear()

    def close(self):
        if self.started and not self.lost:
            self.ray.shutdown()

    def describe(self) -> str:
        nodes = len([n for n in self.ray.nodes() if n.get("Alive")])
        return f"ray ({self.workers} worker{'s' if self.workers != 1 else ''}, {nodes} node{'s' if nodes != 1 else ''})"


def _reachable(address: str, timeout: float, fix: str) -> None:
    """A HOST:PORT that nothing answers on is refused at once, naming it (ray.init would wait forever)."""
    import socket

    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or address.startswith(("ray://", "auto")):
        return
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=timeout):
            pass
    except TimeoutError:
        raise ConfigError(f"no answer from the Ray cluster at {address} within {timeout:g} s; check the address "
                          f"and the network, or raise --connect-timeout; {fix}") from None
    except OSError as e:
        raise ConfigError(f"cannot reach the Ray cluster at {address} ({e.strerror or e}); {fix}") from None


def make_executor(name: str, *, workers: int | None = None, ray_address: str = RAY_ADDRESS,
                  retries: int = RETRIES, timeout: float | None = None) -> Executor:
    if name == "inprocess":
        return InProcess()
    if name == "processes":
        return Processes(workers)
    if name == "ray":
        return Ray(workers, ray_address, retries, timeout)
    raise ConfigError(f"unknown executor {name!r}; use one of {', '.join(EXECUTORS)}")
