"""Bad-input catalogue: a build's work directory in an object store (--work-dir s3://..., moto's S3 server). Each
case is checked by check_case (one error line naming what, where and how to fix it; nothing complete-looking
left behind): a work URL in a bucket that does not exist (no write access), a work URL holding someone's objects
or another build's plan, a scheme that cannot hold one (or holds it in this process's memory only), a work URL
overlapping --out, a --chat-template file the tasks could not fetch, and a store that stops answering
mid-commit (a proxy in front of moto that never answers a read of a part)."""

from __future__ import annotations

import collections
import http.client
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from .conftest import sample_texts
from .test_bad_input_catalogue import Case, check_case, world  # noqa: F401  (world: a fixture)
from .test_bad_input_catalogue_build3 import _chats, _own_spm

STORE: dict = {}  # the bucket of the running case (the `store` fixture)


def _corpus(tmp, n: int = 4):
    d = tmp / "in"
    d.mkdir(exist_ok=True)
    texts = [t for t in sample_texts() if t.strip()]
    for k in range(n):
        (d / f"c{k}.jsonl").write_text("".join(json.dumps({"text": t[:2000]}) + "\n" for t in texts[k::n]))
    return d


def _build(w, tmp, work: str, *extra: str) -> list[str]:
    return ["build", str(_corpus(tmp)), "--out", str(tmp / "out"), "--tokenizer", str(w.tokenizer), "--executor",
            "processes", "--workers", "1", "--task-bytes", "20KB", "--work-dir", work, "--no-progress", *extra]


def work_in_a_missing_bucket(w, tmp):
    return _build(w, tmp, "s3://no-such-bucket-of-anyone/work")


def work_holding_someones_objects(w, tmp):
    STORE["fs"].pipe_file(f"{STORE['bucket']}/work/report.pdf", b"%PDF a user's file")
    return _build(w, tmp, f"s3://{STORE['bucket']}/work")


def work_holding_another_builds_plan(w, tmp):
    STORE["fs"].pipe_file(f"{STORE['bucket']}/work/plan.json", json.dumps({"tasks": [], "out": "s3://x/other"}).encode())
    return _build(w, tmp, f"s3://{STORE['bucket']}/work")


def work_at_a_read_only_scheme(w, tmp):
    return _build(w, tmp, "https://example.invalid/work")


def work_at_an_unknown_scheme(w, tmp):
    return _build(w, tmp, "foo://bucket/work")


def work_in_memory_for_worker_processes(w, tmp):
    return _build(w, tmp, "memory://scratch/work")


def work_inside_the_output(w, tmp):
    b = STORE["bucket"]
    return ["build", str(_corpus(tmp)), "--out", f"s3://{b}/cache", "--tokenizer", str(w.tokenizer), "--work-dir",
            f"s3://{b}/cache/work", "--no-progress"]


def chat_template_file_with_a_work_url(w, tmp):
    (tmp / "chat.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    return ["build", str(_chats(tmp)), "--chat", "--out", str(tmp / "out"), "--tokenizer", str(_own_spm(tmp)),
            "--chat-template", str(tmp / "chat.jinja"), "--executor", "processes", "--workers", "1",
            "--work-dir", f"s3://{STORE['bucket']}/work", "--no-progress"]


def store_stalls_mid_commit(w, tmp):
    STORE["proxy"].stall = True
    return _build(w, tmp, f"s3://{STORE['bucket']}/work")


class StallingProxy:
    """An HTTP proxy in front of the S3 server that passes every request through, except, once `stall` is set,
    a GET of a part (`/parts/<id>.bin`, what only the commit reads): that one is accepted and never answered.
    Once `slow` is set, such a GET is answered at about 12 KB/s (1,200 bytes every 0.1 s; counted in `slowed`).
    `delay`: seconds every such GET waits before it is passed on; `busiest`: the most of them under way at once."""

    def __init__(self, target: str):
        host, port = target.rsplit("/", 1)[-1].split(":")
        self.stall, self.stalled, self.done = False, 0, threading.Event()
        self.slow, self.slowed, self.methods = False, 0, collections.Counter()  # requests by HTTP method
        self.delay, self.busiest, self._parts, self._lock = 0.0, 0, 0, threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _pass(self):
                outer.methods[self.command] += 1
                part = self.command == "GET" and "/parts/" in self.path and self.path.split("?")[0].endswith(".bin")
                if part and outer.stall:
                    outer.stalled += 1
                    outer.done.wait(60)
                    self.close_connection = True
                    return
                if part:
                    with outer._lock:
                        outer._parts += 1
                        outer.busiest = max(outer.busiest, outer._parts)
                    try:
                        time.sleep(outer.delay)
                        self._forward(part)
                    finally:
                        with outer._lock:
                            outer._parts -= 1
                else:
                    self._forward(part)

            def _forward(self, part: bool):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                conn = http.client.HTTPConnection(host, int(port), timeout=30)
                conn.request(self.command, self.path, body=body, headers=dict(self.headers))
                r = conn.getresponse()
                data = r.read()
                self.send_response(r.status)
                for k, v in r.getheaders():
                    if k.lower() not in ("transfer-encoding", "content-length", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if part and outer.slow:
                    outer.slowed += 1
                    for i in range(0, len(data), 1200):
                        self.wfile.write(data[i:i + 1200])
                        self.wfile.flush()
                        time.sleep(0.1)
                else:
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.done.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def store(s3, s3_endpoint, monkeypatch):
    import fsspec
    import s3fs

    fs, bucket = s3
    proxy = StallingProxy(s3_endpoint)
    monkeypatch.setitem(fsspec.config.conf, "s3", {**fsspec.config.conf["s3"], "endpoint_url": proxy.url})
    monkeypatch.setenv("NIELS_GPT_NETWORK_TIMEOUT_S", "10")  # a stall ends after 10 s (5 s failed once on a loaded machine)
    s3fs.S3FileSystem.clear_instance_cache()
    STORE.update(fs=fs, bucket=bucket[len("s3://"):], proxy=proxy)
    yield STORE
    proxy.close()
    STORE.clear()
    s3fs.S3FileSystem.clear_instance_cache()


CASES = [
    Case("build: --work-dir in a bucket that does not exist", work_in_a_missing_bucket,
         ("s3://no-such-bucket-of-anyone/work", "does not exist", "--work-dir"), out="out"),
    Case("build: --work-dir holding someone's objects", work_holding_someones_objects,
         ("--work-dir", "/work", "report.pdf", "not a build's work files"), out="out"),
    Case("build: --work-dir holding another build's plan", work_holding_another_builds_plan,
         ("--work-dir", "s3://x/other", "plan of a build", "choose another --work-dir"), out="out"),
    Case("build: --work-dir at a read-only scheme", work_at_a_read_only_scheme,
         ("https://example.invalid/work", "read-only"), out="out"),
    Case("build: --work-dir at an unknown scheme", work_at_an_unknown_scheme,
         ("foo://bucket/work", "not supported", "s3://"), out="out"),
    Case("build: a memory:// --work-dir for worker processes", work_in_memory_for_worker_processes,
         ("--work-dir memory://scratch/work", "this process alone", "--executor processes", "s3://"), out="out"),
    Case("build: --work-dir inside an --out URL", work_inside_the_output,
         ("--work-dir", "overlaps --out", "choose separate prefixes")),
    Case("build: --chat-template file with a --work-dir URL", chat_template_file_with_a_work_url,
         ("--chat-template", "--work-dir s3://", "tokenizer_config.json", "beside the model"), out="out"),
    Case("build: the work store stops answering mid-commit", store_stalls_mid_commit,
         ("reading s3://", "/work/parts/", ".bin", "no answer within 10 s", "--network-timeout"), out="out"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_one_clear_line(case, store, world, tmp_path, capsys):  # noqa: F811  (world: the fixture)
    check_case(case, world, tmp_path, capsys)
    if case.make is work_holding_someones_objects:
        assert store["fs"].cat_file(f"{store['bucket']}/work/report.pdf") == b"%PDF a user's file"
    if case.make is store_stalls_mid_commit:
        assert store["proxy"].stalled >= 1
        # the tasks' receipts stay in the store, for the rerun to reuse
        assert [k for k in store["fs"].find(f"{store['bucket']}/work/parts") if k.endswith(".json")]
