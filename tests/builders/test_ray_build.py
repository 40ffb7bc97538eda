"""`build --executor ray` on a real local Ray cluster: byte identity across the three executors, joining a running
cluster by address from the CLI, a worker killed midway then resumed, a bad record named across
processes. One cluster for the module (2 CPUs, no dashboard), shut down after; ~15 s in all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from niels_gpt.builders.cli import ALL_TOKENS
from niels_gpt.builders.plan import make_plan
from niels_gpt.builders.run import BuildSpec, build
from niels_gpt.errors import CacheError, SourceError


def run_build(inputs, out, log=None, **kw):
    """`build` over these inputs (each a path or URL) into `out`."""
    return build(BuildSpec(sources=[str(p) for p in inputs], out=str(out), **kw), log)

pytest.importorskip("ray")
REPO = Path(__file__).resolve().parents[2]
KW = {"max_tokens": ALL_TOKENS, "val_tokens": 5_000, "shard_bytes": 20_000, "seed": 7,
      "name": "mine"}


@pytest.fixture(scope="module")
def local_caches(corpus, tokenizer, build_reference, tree, tmp_path_factory) -> dict:
    """The reference, in-process and local-process caches, built before Ray starts (the pool forks)."""
    root = tmp_path_factory.mktemp("dist-local")
    plan = make_plan(corpus["paths"], tokenizer=tokenizer)
    out = {"reference": tree(build_reference(corpus["docs"], root / "ref", source=plan.describe(), plan=plan, **KW))}
    for executor in ("inprocess", "processes"):
        run_build(corpus["paths"], root / executor, tokenizer=tokenizer.model_path, executor=executor, workers=2,
                   task_bytes=40_000, **KW)
        out[executor] = tree(root / executor)
    return out


def same_cache(got: dict, want: dict, *drop: str) -> None:
    """The same files byte for byte, and the same meta.json but for the encoder (and `drop`): the cluster's
    workers encode with the tokenizer's own library (see ray_cluster), which their receipts say, so meta.json
    names no fast encoder; the local builds ran gigatoken."""
    assert {k: v for k, v in got.items() if k != "meta.json"} == {k: v for k, v in want.items() if k != "meta.json"}
    metas = [json.loads(t["meta.json"]) for t in (got, want)]
    assert "encoder" not in metas[0] and metas[1]["encoder"].startswith("gigatoken")
    for m in metas:
        for key in ("encoder", "record_sha256", *drop):
            m.pop(key, None)
    assert metas[0] == metas[1]


@pytest.fixture(scope="module")
def ray_cluster(local_caches):
    import ray

    # the workers encode with the tokenizer's own library (the same ids; meta.json says so): with the fast
    # encoder the killed-midway test's long task ran 0.03 s, too short for a loaded machine to catch it working
    ctx = ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                   configure_logging=False, runtime_env={"env_vars": {"NIELS_GPT_ENCODER": "reference"}})
    yield ctx.address_info["gcs_address"]
    ray.shutdown()


def test_in_process_local_processes_and_ray_write_identical_caches(local_caches, ray_cluster, corpus, tokenizer,
                                                                   tree, tmp_path):
    assert local_caches["inprocess"] == local_caches["reference"]
    assert local_caches["processes"] == local_caches["reference"]
    for task_bytes in (40_000, 7_000):
        s = run_build(corpus["paths"], tmp_path / str(task_bytes), tokenizer=tokenizer.model_path, executor="ray",
                       workers=2, task_bytes=task_bytes, **KW)
        assert s["executor"] == "ray (2 workers, 1 node)" and s["ran"] == s["tasks"] > 8
        same_cache(tree(tmp_path / str(task_bytes)), local_caches["reference"])


def test_workers_caps_the_ray_tasks_running_at_once(ray_cluster, corpus, tokenizer, tmp_path):
    import json

    s = run_build(corpus["paths"], tmp_path / "one", tokenizer=tokenizer.model_path, executor="ray", workers=1,
                   task_bytes=20_000, keep_parts=True, **KW)
    parts = tmp_path / "one.build" / "parts"
    spans = sorted((json.loads(p.with_suffix(".started").read_text())["time"], json.loads(p.read_text())["finished"])
                   for p in parts.glob("*.json"))
    assert len(spans) == s["tasks"] > 10
    assert all(start >= prev_end for (_, prev_end), (start, _) in zip(spans, spans[1:], strict=False))


def test_relative_paths_reach_ray_workers_as_absolute_ones(ray_cluster, local_caches, corpus, tokenizer, tree,
                                                           tmp_path, monkeypatch):
    import shutil

    shutil.copytree(Path(tokenizer.model_path).parent, tmp_path / "tok")
    monkeypatch.chdir(tmp_path)
    run_build(corpus["paths"], "rel-out", tokenizer="tok", executor="ray", workers=2, task_bytes=40_000, **KW)
    got, want = tree(tmp_path / "rel-out"), local_caches["reference"]
    meta = json.loads(got["meta.json"])
    assert meta["tokenizer"].pop("path") == str((tmp_path / "tok" / "spm.model").resolve())  # the copy it used
    got["meta.json"] = json.dumps(meta).encode()
    same_cache(got, want, "tokenizer")
    assert meta["tokenizer"] == {k: v for k, v in json.loads(want["meta.json"])["tokenizer"].items() if k != "path"}


def test_cli_joins_a_running_cluster_by_address(ray_cluster, local_caches, corpus, tokenizer, tree, tmp_path):
    out = tmp_path / "cli"
    cmd = [sys.executable, "-m", "niels_gpt.cache.cli", "build", *map(str, corpus["paths"]), "--out", str(out),
           "--tokenizer", tokenizer.model_path, "--val-tokens", "5000", "--shard-bytes", "20000", "--seed", "7",
           "--name", "mine", "--task-bytes", "40000", "--executor", "ray", "--ray-address", ray_cluster,
           "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "executor ray (2 workers, 1 node)" in r.stdout
    # a job of its own: the cluster's NIELS_GPT_ENCODER (ray_cluster's job) does not reach its tasks, which run
    # gigatoken as the local builds did, meta.json included
    got, want = tree(out), local_caches["reference"]
    assert got.keys() == want.keys() and [k for k in got if got[k] != want[k]] == [], (got.get("meta.json"), want["meta.json"])


def test_a_worker_killed_midway_fails_the_build_and_resume_reruns_only_unfinished_tasks(
        ray_cluster, corpus, tokenizer, build_reference, tree, tmp_path, kill_when_started):
    big = tmp_path / "big.txt"  # one document, one task: long enough to be caught midway (~1 s, see ray_cluster)
    texts = [d for d in corpus["docs"] if isinstance(d, str)]
    big.write_text("\n\n".join(texts[40:] + texts[:40]) * 4, encoding="utf-8")  # not opening like a Gutenberg book
    inputs = corpus["paths"][:2] + [big] + corpus["paths"][2:]
    plan = make_plan(inputs, tokenizer=tokenizer, task_bytes=40_000)
    victim = next(t for t in plan.tasks if [p["item"] for p in t.pieces] == [str(big.resolve())])
    assert 0 < victim.index < len(plan.tasks) - 1
    out = tmp_path / "out"
    parts = out.parent / (out.name + ".build") / "parts"
    pid, failure = kill_when_started(
        lambda: run_build(inputs, out, tokenizer=tokenizer.model_path, executor="ray", workers=2,
                           task_bytes=40_000, retries=0, **KW),
        parts / f"{victim.id}.started", writing=f"{victim.id}.bin.tmp-*")
    assert failure and isinstance(failure[0], CacheError), failure
    assert f"task {victim.id}" in str(failure[0]) and "run the same command again to resume" in str(failure[0])
    assert not (parts / f"{victim.id}.json").exists()
    assert list(parts.glob(f"{victim.id}.bin.tmp-{pid}"))  # killed while writing its part
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in parts.glob("*.json")}
    assert 0 < len(before) < len(plan.tasks)

    s = run_build(inputs, out, tokenizer=tokenizer.model_path, executor="ray", workers=2, task_bytes=40_000,
                   keep_parts=True, **KW)
    assert s["reused"] == len(before) and s["ran"] == len(plan.tasks) - len(before)
    for name, (mtime, data) in before.items():
        assert (parts / name).stat().st_mtime_ns == mtime and (parts / name).read_bytes() == data
    docs = corpus["docs"][:len(corpus["docs"]) - 3]  # the reference stream: jsonl, parquet, big.txt, the .txt files
    docs += [big.read_text(encoding="utf-8")] + corpus["docs"][-3:]
    whole = make_plan(inputs, tokenizer=tokenizer)
    ref = build_reference(docs, tmp_path / "ref", source=whole.describe(), plan=whole, **KW)
    same_cache(tree(out), tree(ref))


def test_a_bad_record_on_a_ray_worker_fails_the_build_with_the_record_named(ray_cluster, corpus, tokenizer,
                                                                           tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"txt": "typo"}\n', encoding="utf-8")
    with pytest.raises(SourceError, match=r"bad\.jsonl, line 2: no 'text' field \(fields: \['txt'\]\)"):
        run_build(corpus["paths"] + [bad], tmp_path / "out", tokenizer=tokenizer.model_path, executor="ray",
                   workers=2, task_bytes=40_000, **KW)
    assert not (tmp_path / "out" / "meta.json").exists()


def test_an_address_that_accepts_but_never_answers_ends_in_one_line(tmp_path):
    """A port that takes the connection and says nothing (not a Ray cluster, or one hung): the join's time limit
    ends it in its own line, naming the address, said once (not wrapped in "cannot join ...")."""
    script = """
import socket, sys
from niels_gpt.builders.executors import Ray
from niels_gpt.errors import ConfigError
silent = socket.socket(); silent.bind(("127.0.0.1", 0)); silent.listen(8)
address = "127.0.0.1:%d" % silent.getsockname()[1]
try:
    Ray(address=address, workers=1, timeout=4)
except ConfigError as e:
    print(address); print(e); sys.exit(3)
"""
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(REPO), "RAY_gcs_rpc_server_reconnect_timeout_s": "60"})
    assert p.returncode == 3, p.stderr[-2000:]
    address, message = p.stdout.strip().split("\n", 1)
    assert message.startswith(f"joining the Ray cluster at {address!r}: no answer within 4 s")
    assert "cannot join" not in message and message.count("ray start --head") == 1
