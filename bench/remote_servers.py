"""Servers for bench_peers.py: moto's S3 server, a proxy adding latency and a bandwidth cap, a disk watcher.

- `ThrottleProxy(upstream, latency_s, bandwidth)`: holds each request `latency_s` before forwarding it and lets
  all response bodies together through at `bandwidth` bytes/s (one token bucket), counting the bytes served;
  `GET /__bytes` and `/__reset` are its own. `ProxyProcess` runs it in a subprocess (`python remote_servers.py
  serve-proxy ...`), so its threads never hold the measured process's GIL.
- `DiskPeak(dir)`: the largest disk a directory holds, sampled every 10 ms by a subprocess: its files' allocated
  blocks plus the deleted files under it that the measuring process or its descendants (DataLoader workers,
  ranks) still map (niels_gpt.readers.held.held_disk), which a directory listing cannot see.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


class ThrottleProxy:
    """HTTP proxy to one upstream: `latency_s` before each request, all bodies together at `bandwidth` B/s."""

    def __init__(self, upstream: str, latency_s: float, bandwidth: float):
        self.host, port = upstream.split("//", 1)[1].split(":")
        self.port, self.latency_s, self.bandwidth = int(port), latency_s, bandwidth
        self.bytes = self.requests = 0
        self._lock = threading.Lock()
        self._free_at = 0.0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _forward(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path in ("/__bytes", "/__reset"):  # the bench's own questions, not forwarded
                    if self.path == "/__reset":
                        outer.reset()
                    data = str(outer.bytes).encode()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                time.sleep(outer.latency_s)
                conn = http.client.HTTPConnection(outer.host, outer.port, timeout=60)
                conn.request(self.command, self.path, body=body, headers=dict(self.headers))
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    for i in range(0, len(data), 1 << 16):
                        outer._throttle(len(data[i:i + (1 << 16)]))
                        self.wfile.write(data[i:i + (1 << 16)])
                with outer._lock:
                    outer.requests += 1
                    outer.bytes += len(data) if self.command != "HEAD" else 0
                conn.close()

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def _throttle(self, n: int) -> None:
        with self._lock:
            now = time.monotonic()
            start = max(now, self._free_at)
            self._free_at = start + n / self.bandwidth
            done = self._free_at
        time.sleep(max(0.0, done - time.monotonic()))

    def reset(self) -> None:
        with self._lock:
            self.bytes = self.requests = 0


class ProxyProcess:
    """ThrottleProxy in a subprocess of this script, so that its threads never hold the measured process's GIL."""

    def __init__(self, upstream: str, latency_s: float, bandwidth: float):
        self.proc = subprocess.Popen([sys.executable, __file__, "serve-proxy", upstream, str(latency_s), str(bandwidth)],
                                     stdout=subprocess.PIPE, text=True)
        self.url = self.proc.stdout.readline().strip()

    def _ask(self, what: str) -> int:
        with urllib.request.urlopen(f"{self.url}/__{what}", timeout=10) as r:
            return int(r.read())

    @property
    def bytes(self) -> int:
        return self._ask("bytes")

    def reset(self) -> None:
        self._ask("reset")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class DiskPeak:
    """The largest disk a directory holds (held_disk: files plus deleted files still mapped by this process
    and its descendants, and `pids` and theirs), sampled every 10 ms by a subprocess of this script."""

    def __init__(self, path: Path, pids=(), *, whole: bool = True):
        """`whole`: every file under `path` by its allocated blocks (any loader's layout); False: a download
        cache's mirrors by their bytes, as its bound counts them."""
        pids = [os.getpid(), *pids]
        self.proc = subprocess.Popen([sys.executable, __file__, "watch-disk", str(path), str(int(whole)),
                                      *map(str, pids)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def stop(self) -> int:
        out, _ = self.proc.communicate("stop\n", timeout=30)
        return int(out.strip())


def watch_disk(path: Path, whole: bool, pids: list[int]) -> None:
    from niels_gpt.readers.held import held_disk

    peak, stop = 0, threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
    while not stop.is_set():
        peak = max(peak, held_disk(path, pids, whole=whole))
        time.sleep(0.01)
    print(max(peak, held_disk(path, pids, whole=whole)), flush=True)


@contextlib.contextmanager
def moto_server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **CREDS})
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(url + "/moto-api/", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    if sys.argv[1] == "serve-proxy":
        proxy = ThrottleProxy(sys.argv[2], float(sys.argv[3]), float(sys.argv[4]))
        print(proxy.url, flush=True)
        threading.Event().wait()
    elif sys.argv[1] == "watch-disk":
        watch_disk(Path(sys.argv[2]), sys.argv[3] == "1", [int(p) for p in sys.argv[4:]])
