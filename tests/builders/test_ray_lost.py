"""A Ray cluster lost while a build's tasks run: the head (a `ray start --head` of this test, every process of its
session) is killed with SIGKILL once a task has finished and another is running. The build ends within its
limit (--connect-timeout 5) in one line naming the cluster's address, and the finished task's receipt stays for
the rerun. ~40 s (a cluster start)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from ..conftest import REPO, free_port, sample_texts

pytest.importorskip("ray")

HOOK = '''
import time

def slow(text):
    """A task of the long file runs for minutes: the cluster is lost while it runs."""
    if text.startswith("LONG"):
        time.sleep(5)
    return text
'''


def _kill_session(proc: subprocess.Popen) -> None:
    """SIGKILL to every process of the session `proc` leads (the head and what it started)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)


def test_a_cluster_lost_midway_ends_the_build_in_one_line_naming_it(tmp_path, tokenizer):
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "lost_hooks.py").write_text(HOOK)
    texts = [t for t in sample_texts() if t.strip()]
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "a.jsonl").write_text(json.dumps({"text": texts[0][:500]}) + "\n")  # one quick task
    (inputs / "b.jsonl").write_text("".join(json.dumps({"text": f"LONG {t[:300]}"}) + "\n" for t in texts[:40]))
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(hooks)]), "RAY_AUTH_MODE": "token"}
    ray_tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    log = open(tmp_path / "head.log", "wb")  # noqa: SIM115 (the head's output, for a failure's message)
    head = subprocess.Popen([sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--node-ip-address",
                             "127.0.0.1", "--port", str(port), "--num-cpus", "1", "--include-dashboard", "false",
                             "--temp-dir", ray_tmp, "--block"], stdout=log, stderr=subprocess.STDOUT, env=env,
                            cwd=tmp_path, start_new_session=True)
    address = f"127.0.0.1:{port}"
    out = tmp_path / "out"
    build = None
    try:
        deadline = time.monotonic() + 300  # a loaded machine starts Ray slowly
        while subprocess.run([sys.executable, "-c", f"import ray; ray.init(address={address!r}); ray.shutdown()"],
                             env=env, capture_output=True, timeout=120).returncode != 0:
            assert time.monotonic() < deadline and head.poll() is None, (tmp_path / "head.log").read_text()[-3000:]
            time.sleep(1)
        build = subprocess.Popen(
            [sys.executable, "-m", "niels_gpt", "build", str(inputs), "--out", str(out), "--tokenizer",
             tokenizer.model_path, "--executor", "ray", "--ray-address", address, "--workers", "1",
             "--connect-timeout", "5", "--map", "lost_hooks:slow", "--no-progress"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
        receipts = tmp_path / "out.build" / "parts"
        deadline = time.monotonic() + 300
        while not list(receipts.glob("*.json")):  # the quick task is done; the long one runs
            assert time.monotonic() < deadline and build.poll() is None, build.communicate()
            time.sleep(0.2)
        time.sleep(1)
        _kill_session(head)
        _, err = build.communicate(timeout=180)  # a build that waited on the lost cluster for ever fails here
        lines = [line for line in err.splitlines() if line.strip()]
        assert build.returncode != 0 and "Traceback" not in err, err[-3000:]
        assert lines[-1].startswith(f"error: lost the Ray cluster at {address}: "), err[-3000:]
        assert "run the same command again" in lines[-1] and "--connect-timeout" in lines[-1]
        assert len(list(receipts.glob("*.json"))) >= 1 and not (out / "meta.json").exists()
    finally:
        if build is not None and build.poll() is None:
            build.kill()
        if head.poll() is None:
            _kill_session(head)
        log.close()
        shutil.rmtree(ray_tmp, ignore_errors=True)
