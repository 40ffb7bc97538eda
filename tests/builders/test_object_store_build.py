"""`build --executor ray` where the nodes share only object storage: a local Ray cluster (2 CPUs) and moto's S3
server, both started here. The Ray node runs in a mount namespace of its own where the driver's directory (its
tokenizer, its current directory) is an empty tmpfs (where unshare and mount work; elsewhere beside the driver,
unhidden), with a working directory, temporary directory and download cache of its own: every task checks
that it cannot see the driver's files (a --map hook run on every document).
s3:// inputs -> s3:// output through an s3:// work URL: the cache is byte-identical to an inline build of the
same inputs; a driver killed with SIGKILL midway and a rerun give the same cache, reusing the receipts in the
store; a worker lost mid-task is retried; --chat and --compress zstd once each. ~60 s in all (10 CLI runs)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from ..conftest import CREDENTIALS, REPO, free_port, sample_texts

pytest.importorskip("ray")
pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

HOOKS = '''
import os, tempfile, time

def check(text):
    """On a Ray node: the driver's directory is hidden and the task has its own directories; then a short pause
    (so a driver can be killed midway). On the driver (no HIDDEN_ROOT): the text as it is."""
    hidden = os.environ.get("HIDDEN_ROOT")
    if hidden:
        assert os.listdir(hidden) == [], "a task sees the driver's directory"
        assert not os.getcwd().startswith(hidden) and tempfile.gettempdir().startswith(os.environ["NODE_ROOT"])
        flag = os.path.join(os.environ["NODE_ROOT"], "die-once")
        try:
            os.rename(flag, flag + ".taken")
        except FileNotFoundError:
            pass
        else:
            os._exit(1)  # this worker is lost mid-task, once
        time.sleep(0.01)
    return text
'''


def _unshare_works() -> bool:
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                        "mount -t tmpfs none /mnt && umount /mnt"], capture_output=True)
    return r.returncode == 0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A moto S3 server and a one-node Ray cluster whose node cannot see the driver's directory."""
    hide = shutil.which("unshare") is not None and _unshare_works()  # else the node sees them (the checks say so)
    driver = tmp_path_factory.mktemp("driver")
    node = tmp_path_factory.mktemp("node")
    hooks = tmp_path_factory.mktemp("hooks")
    (hooks / "store_build_hooks.py").write_text(HOOKS)
    (node / "tmp").mkdir()
    port, ray_port = free_port(), free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = {**os.environ, **CREDENTIALS, "FSSPEC_S3_ENDPOINT_URL": endpoint,
           "PYTHONPATH": os.pathsep.join([str(REPO), str(hooks)]), "RAY_AUTH_MODE": "token"}
    moto = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    node_env = {**env, "NODE_ROOT": str(node), "TMPDIR": str(node / "tmp"), "NIELS_GPT_CACHE": str(node / "cache"),
                **({"HIDDEN_ROOT": str(driver)} if hide else {})}
    # NOTE: a session directory of its own (short: Ray's socket paths must fit 107 bytes): two clusters started
    # at once on one machine (another test file's, on the other test process) raced on /tmp/ray's links
    ray_tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    ray_cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--node-ip-address", "127.0.0.1",
               "--port", str(ray_port), "--num-cpus", "2", "--include-dashboard", "false", "--temp-dir", ray_tmp,
               "--block"]
    if hide:  # the node in a mount namespace of its own, where the driver's directory is an empty tmpfs
        ray_cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                   f"mount -t tmpfs none {driver} && exec " + " ".join(ray_cmd)]
    head_log = open(node / "ray-head.log", "wb")  # noqa: SIM115 (the head's output, for a failure's message)
    head = subprocess.Popen(ray_cmd, stdout=head_log, stderr=subprocess.STDOUT, env=node_env, cwd=node)
    try:
        import s3fs

        deadline = time.monotonic() + 90
        fs = s3fs.S3FileSystem(endpoint_url=endpoint, key="testing", secret="testing")
        while True:
            try:
                fs.mkdir("caches")
                break
            except Exception:  # noqa: BLE001 (not up yet)
                assert time.monotonic() < deadline and moto.poll() is None, "moto did not start"
                time.sleep(0.2)
        texts = [t for t in sample_texts() if t.strip()]
        lines = [json.dumps({"text": t[i:i + 1500]}) + "\n" for t in texts for i in range(0, len(t), 1500)]
        for k in range(4):  # an object per task (a URL's JSON Lines are not cut into ranges)
            fs.pipe_file(f"caches/in/a{k}.jsonl", "".join(lines[k::4][:60]).encode())
        fs.pipe_file("caches/in/b.txt", texts[0].encode())
        chats = "".join(json.dumps({"messages": [{"role": "user", "content": t[:200]},
                                                 {"role": "assistant", "content": t[200:600]}]}) + "\n"
                        for t in texts for _ in range(3))
        fs.pipe_file("caches/chat/c.jsonl", chats.encode())
        from niels_gpt.tokenizer import TrainSettings, train_tokenizer

        tok = train_tokenizer(texts, driver / "tok", settings=TrainSettings(vocab_size=2000))
        address = f"127.0.0.1:{ray_port}"
        deadline = time.monotonic() + 300  # a loaded machine (the suite on two cores) starts Ray slowly
        while True:
            try:
                if subprocess.run([sys.executable, "-c", f"import ray; ray.init(address={address!r}); ray.shutdown()"],
                                  env=env, capture_output=True, timeout=120).returncode == 0:
                    break
            except subprocess.TimeoutExpired:
                pass
            assert time.monotonic() < deadline and head.poll() is None, (
                f"the Ray head at {address} did not start:\n" + (node / "ray-head.log").read_text(errors="replace")[-3000:])
            time.sleep(1)
        yield {"fs": fs, "env": env, "driver": driver, "hidden": hide, "node": node, "tok": str(Path(tok.model_path).parent),
               "address": address}
    finally:
        for p in (head, moto):  # processes this fixture started, by their handle
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        head_log.close()
        shutil.rmtree(ray_tmp, ignore_errors=True)


def _build(c, srcs, out, *extra, check=True, **popen) -> subprocess.CompletedProcess | subprocess.Popen:
    cmd = [sys.executable, "-m", "niels_gpt", "build", *srcs, "--out", out, "--tokenizer", c["tok"], "--name", "mine",
           "--map", "store_build_hooks:check", "--task-bytes", "20KB", "--no-progress", *extra]
    if popen:
        return subprocess.Popen(cmd, env=c["env"], cwd=c["driver"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    r = subprocess.run(cmd, env=c["env"], cwd=c["driver"], capture_output=True, text=True, timeout=300)
    if check:
        assert r.returncode == 0, r.stderr[-3000:]
    return r


def _ray(c, work) -> list[str]:
    return ["--executor", "ray", "--ray-address", c["address"], "--workers", "2", "--work-dir", work]


def _objects(fs, prefix: str) -> dict[str, bytes]:
    return {k[len(prefix) + 1:]: fs.cat_file(k) for k in fs.find(prefix)}


def _ran(stdout: str) -> tuple[int, int, int]:
    m = re.search(r"(\d+) task\(s\), (\d+) ran, (\d+) reused", stdout)
    assert m, stdout
    return int(m[1]), int(m[2]), int(m[3])


def _no_task_leftovers(c) -> None:
    tmp = c["node"] / "tmp"
    assert [p for p in tmp.iterdir() if p.name.startswith("niels_gpt_task_")] == []
    cached = [p.name for p in (c["node"] / "cache" / "remote" / "tokenizers").iterdir()]
    assert len(cached) == 1 and len(cached[0]) == 64  # the tokenizer, fetched once for the node, by its sha256


def test_s3_inputs_to_s3_output_through_an_s3_work_url_match_an_inline_build(cluster):
    c, fs = cluster, cluster["fs"]
    srcs = ["s3://caches/in/"]
    _build(c, srcs, "s3://caches/ref", "--val-tokens", "3000", "--executor", "inline")
    (c["node"] / "die-once").write_text("")  # one worker is lost mid-task: Ray runs that task again
    r = _build(c, srcs, "s3://caches/ray", "--val-tokens", "3000", *_ray(c, "s3://caches/work"), "--retries", "2")
    tasks, ran, reused = _ran(r.stdout)
    assert tasks == ran == 5 and reused == 0 and (c["node"] / "die-once.taken").exists()
    assert _objects(fs, "caches/ray") == _objects(fs, "caches/ref")
    assert not fs.exists("caches/work/plan.json") and fs.find("caches/work") == []
    assert not (c["driver"] / "s3:").exists()
    _no_task_leftovers(c)


def test_a_driver_killed_midway_resumes_from_the_receipts_in_the_store(cluster):
    c, fs = cluster, cluster["fs"]
    srcs = ["s3://caches/in/"]
    _build(c, srcs, "s3://caches/ref2", "--executor", "inline")
    args = (srcs, "s3://caches/killed", *_ray(c, "s3://caches/kwork"), "--workers", "1")
    driver = _build(c, *args, popen=True)
    deadline = time.monotonic() + 120
    while not [k for k in fs.find("caches/kwork/parts") if k.endswith(".json")]:
        assert driver.poll() is None and time.monotonic() < deadline, "no receipt appeared before the build ended"
        time.sleep(0.05)
        fs.invalidate_cache()
    driver.send_signal(signal.SIGKILL)  # the driver, a process this test started
    driver.wait(30)
    kept, still = None, 0
    while still < 3:  # until the store stops changing: the tasks of the killed job have ended
        time.sleep(1)
        fs.invalidate_cache()
        now = {k for k in fs.find("caches/kwork/parts") if k.endswith(".json")}
        still, kept = (still + 1 if now == kept else 0), now
    assert kept and not fs.exists("caches/killed/meta.json")
    r = _build(c, *args)
    tasks, ran, reused = _ran(r.stdout)
    assert reused >= len(kept) and ran == tasks - reused and ran > 0
    assert _objects(fs, "caches/killed") == _objects(fs, "caches/ref2")
    assert fs.find("caches/kwork") == []


def test_chat_and_zstd_through_an_s3_work_url(cluster):
    c, fs = cluster, cluster["fs"]
    _build(c, ["s3://caches/chat/c.jsonl"], "s3://caches/cref", "--chat", "--val-frac", "0.1", "--executor", "inline")
    _build(c, ["s3://caches/chat/c.jsonl"], "s3://caches/cray", "--chat", "--val-frac", "0.1",
           *_ray(c, "s3://caches/cwork"))
    assert _objects(fs, "caches/cray") == _objects(fs, "caches/cref")
    srcs = ["s3://caches/in/a0.jsonl", "s3://caches/in/a1.jsonl"]
    _build(c, srcs, "s3://caches/zref", "--compress", "zstd", "--shard-bytes", "64KiB", "--executor", "inline")
    _build(c, srcs, "s3://caches/zray", "--compress", "zstd", "--shard-bytes", "64KiB")  # default work: <out>.build
    assert _objects(fs, "caches/zray") == _objects(fs, "caches/zref")
    assert fs.find("caches/zray.build") == []


def test_an_input_only_the_driver_has_is_refused_in_one_line(cluster):
    c = cluster
    local = c["driver"] / "mine.txt"
    local.write_text("a document only the driver's machine has\n")
    r = _build(c, [str(local), "s3://caches/in/b.txt"], "s3://caches/local-in", *_ray(c, "s3://caches/lwork"),
               "--retries", "0", check=False)
    assert r.returncode == (1 if c["hidden"] else 0)  # a node that sees the driver's files reads them
    if c["hidden"]:
        line = [x for x in r.stderr.splitlines() if x.strip()][-1]
        assert line.startswith("error: ") and str(local) in line and "at a URL" in line
