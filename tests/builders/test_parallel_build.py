"""The parallel path of `build` without Ray: the plan, the commit against build_pretrain_cache, resume, every
rejection (through `dist_build`, the old Python name, which maps onto `build`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from niels_gpt.builders.plan import make_plan
from niels_gpt.builders.run import ALL_TOKENS, BuildSpec, build
from niels_gpt.cache.cli import main
from niels_gpt.cache.meta import read_meta
from niels_gpt.errors import CacheError, ConfigError, SourceError, TokenizerError
from niels_gpt.sources.records import Piece

from ..conftest import kill_and_check_workers_end, process_alive


def run_build(inputs, out, log=None, **kw):
    """`build` over these inputs (each a path or URL) into `out`."""
    return build(BuildSpec(sources=[str(p) for p in inputs], out=str(out), **kw), log)

SPEC = {"rules": {"text_field": "text", "messages_field": "messages", "chat_columns": None, "on_bad_record": "error"},
        "chat": False}  # a pretraining task's spec (builders/parallel.py makes it from the plan)
SETTINGS = [  # (train budget, val budget, shard bytes): every token; budgets met mid-stream; no val
    (ALL_TOKENS, 5_000, 20_000),
    (60_000, 7_777, 16_384),
    (30_001, 0, 1 << 20),
]


def settings(train, val, shard):
    return {"max_tokens": train, "val_tokens": val, "shard_bytes": shard, "seed": 7,
            "name": "mine"}


@pytest.mark.parametrize("budgets", SETTINGS, ids=["all", "cut", "noval"])
def test_in_process_and_processes_write_the_local_builders_bytes(corpus, tokenizer, build_reference, tree,
                                                                  tmp_path, budgets):
    kw = settings(*budgets)
    plan = make_plan(corpus["paths"], tokenizer=tokenizer, task_bytes=40_000)
    assert len(plan.tasks) >= 8  # the 256-document runs of the builder cross task boundaries
    ref = tree(build_reference(corpus["docs"], tmp_path / "ref", source=plan.describe(), plan=plan, **kw))
    assert "train/shard_00000.bin" in ref
    for executor, task_bytes in (("inprocess", 40_000), ("processes", 40_000), ("processes", 1 << 30)):
        out = tmp_path / f"{executor}-{task_bytes}"
        summary = run_build(corpus["paths"], out, tokenizer=tokenizer.model_path, executor=executor, workers=2,
                             task_bytes=task_bytes, **kw)
        assert tree(out) == ref, (executor, task_bytes)
        assert not (out.parent / (out.name + ".build")).exists()  # parts are removed after the commit
        assert summary["tokens"] == sum(read_meta(str(out))["totals"][f"{s}_tokens"] for s in ("train", "val"))
    meta = json.loads(ref["meta.json"])
    assert meta["skipped"]["empty_document"] >= 1  # the empties reached the rule, and were counted alike


def test_budget_met_early_runs_only_the_tasks_it_needs(corpus, tokenizer, tmp_path):
    s = run_build(corpus["paths"], tmp_path / "c", tokenizer=tokenizer.model_path, executor="inprocess",
                   task_bytes=20_000, **settings(2_000, 500, 1 << 20))
    # the builder reads whole runs of 256 documents (~130 kB here): the commit needs those tasks, no more
    assert s["tasks"] > 20 and s["ran"] <= 8
    assert read_meta(str(tmp_path / "c"))["source_exhausted"] is False


def test_plan_ids_are_stable_and_follow_the_inputs(corpus, tokenizer, tmp_path):
    a = make_plan(corpus["paths"], tokenizer=tokenizer, task_bytes=40_000)
    b = make_plan(corpus["paths"], tokenizer=tokenizer, task_bytes=40_000)
    assert [t.id for t in a.tasks] == [t.id for t in b.tasks]
    assert [t.index for t in a.tasks] == list(range(len(a.tasks)))
    assert {Piece(**p).kind for t in a.tasks for p in t.pieces} == {".jsonl", ".parquet", ".txt"}
    copy = tmp_path / "a.jsonl"
    copy.write_bytes(corpus["paths"][0].read_bytes() + b'{"text": "one more"}\n')
    c = make_plan([copy], tokenizer=tokenizer, task_bytes=40_000)
    assert not {t.id.split("-")[1] for t in c.tasks} & {t.id.split("-")[1] for t in a.tasks}


@pytest.mark.parametrize("task_bytes", [1, 7_000, 40_000, 1 << 30])
def test_jsonl_ranges_are_whole_lines_of_about_equal_size(corpus, tokenizer, task_bytes):
    path = corpus["paths"][0]
    data = path.read_bytes()
    tasks = [Piece(**t.pieces[0]) for t in make_plan([path], tokenizer=tokenizer, task_bytes=task_bytes).tasks]
    assert tasks[0].start == 0 and tasks[-1].stop == len(data)
    assert all(a.stop == b.start and data[b.start - 1:b.start] == b"\n" for a, b in zip(tasks, tasks[1:], strict=False))
    n = -(-len(data) // task_bytes)
    longest = max(len(line) + 1 for line in data.split(b"\n"))
    sizes = [t.stop - t.start for t in tasks]
    assert len(tasks) <= n and all(b <= len(data) / n + longest for b in sizes)
    if task_bytes == 7_000:  # no small last task: every range within a line of the mean
        assert len(tasks) == n and min(sizes) >= len(data) / n - longest


def test_resume_reruns_only_tasks_without_a_valid_receipt(corpus, tokenizer, build_reference, tree, tmp_path):
    kw = settings(ALL_TOKENS, 5_000, 20_000)
    bad = tmp_path / "z-bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": "also fine"}\n{"text": 12}\n', encoding="utf-8")
    out = tmp_path / "out"
    with pytest.raises(SourceError, match=r"z-bad\.jsonl, line 3: field 'text' is int.*run the same command"):
        run_build(corpus["paths"] + [bad], out, tokenizer=tokenizer.model_path, executor="processes", workers=2,
                   task_bytes=40_000, **kw)
    assert not (out / "meta.json").exists()
    parts = out.parent / (out.name + ".build") / "parts"
    receipts = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in parts.glob("*.json")}
    plan = make_plan(corpus["paths"] + [bad], tokenizer=tokenizer, task_bytes=40_000)
    assert len(receipts) == len(plan.tasks) - 1  # every task but the bad one finished
    bad.write_text('{"text": "fine"}\n{"text": "also fine"}\n{"text": "twelve"}\n', encoding="utf-8")
    s = run_build(corpus["paths"] + [bad], out, tokenizer=tokenizer.model_path, executor="processes", workers=2,
                   task_bytes=40_000, keep_parts=True, **kw)
    assert (s["ran"], s["reused"]) == (1, len(plan.tasks) - 1)
    for name, (mtime, data) in receipts.items():  # reused receipts were not rewritten
        assert (parts / name).stat().st_mtime_ns == mtime and (parts / name).read_bytes() == data
    docs = corpus["docs"] + ["fine", "also fine", "twelve"]
    whole = make_plan(corpus["paths"] + [bad], tokenizer=tokenizer)
    ref = build_reference(docs, tmp_path / "ref", source=whole.describe(), plan=whole, **kw)
    assert tree(out) == tree(ref)


def test_a_killed_worker_process_fails_the_build_and_resume_reruns_only_unfinished_tasks(
        corpus, tokenizer, build_reference, tree, tmp_path, kill_when_started, monkeypatch):
    # the tokenizer's own library encodes (the same ids): with the fast encoder the long task below ran 0.03 s,
    # too short for a loaded machine to catch it working
    monkeypatch.setenv("NIELS_GPT_ENCODER", "reference")
    kw = settings(ALL_TOKENS, 5_000, 20_000)
    big = tmp_path / "big.txt"  # one document, one task: long enough to be caught midway (~1 s)
    texts = [d for d in corpus["docs"] if isinstance(d, str)]
    big.write_text("\n\n".join(texts[40:] + texts[:40]) * 4, encoding="utf-8")  # not opening like a Gutenberg book
    inputs = corpus["paths"][:1] + [big] + corpus["paths"][1:]
    plan = make_plan(inputs, tokenizer=tokenizer, task_bytes=40_000)
    victim = next(t for t in plan.tasks if [p["item"] for p in t.pieces] == [str(big.resolve())])
    out = tmp_path / "out"
    parts = out.parent / (out.name + ".build") / "parts"
    pid, failure = kill_when_started(
        lambda: run_build(inputs, out, tokenizer=tokenizer.model_path, executor="processes", workers=2,
                           task_bytes=40_000, **kw),
        parts / f"{victim.id}.started", writing=f"{victim.id}.bin.tmp-*")
    assert failure and isinstance(failure[0], CacheError), failure
    assert "a worker process died" in str(failure[0]) and "run the same command again to resume" in str(failure[0])
    assert not (parts / f"{victim.id}.json").exists() and list(parts.glob(f"{victim.id}.bin.tmp-{pid}"))
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in parts.glob("*.json")}
    assert 0 < len(before) < len(plan.tasks)
    s = run_build(inputs, out, tokenizer=tokenizer.model_path, executor="processes", workers=2, task_bytes=40_000,
                   keep_parts=True, **kw)
    assert s["reused"] == len(before) and s["ran"] == len(plan.tasks) - len(before)
    for name, (mtime, data) in before.items():
        assert (parts / name).stat().st_mtime_ns == mtime and (parts / name).read_bytes() == data
    n_jsonl = corpus["per_path"][0]  # the reference stream: a.jsonl, big.txt, b.parquet, the .txt files
    docs = corpus["docs"][:n_jsonl] + [big.read_text(encoding="utf-8")] + corpus["docs"][n_jsonl:]
    ref = build_reference(docs, tmp_path / "ref", source=plan.describe(), plan=plan, **kw)
    assert tree(out) == tree(ref)


def test_a_damaged_part_fails_the_commit_and_is_redone(corpus, tokenizer, tree, tmp_path):
    kw = settings(ALL_TOKENS, 5_000, 20_000)
    out = tmp_path / "out"
    run_build(corpus["paths"], out, tokenizer=tokenizer.model_path, executor="inprocess", task_bytes=40_000,
               keep_parts=True, **kw)
    good = tree(out)
    part = sorted((out.parent / (out.name + ".build") / "parts").glob("*.bin"))[3]
    data = bytearray(part.read_bytes())
    data[10] ^= 1
    part.write_bytes(bytes(data))
    with pytest.raises(CacheError, match=r"digest differs from its receipt.*run the same command again"):
        run_build(corpus["paths"], out, tokenizer=tokenizer.model_path, executor="inprocess", task_bytes=40_000,
                   keep_parts=True, **kw)
    s = run_build(corpus["paths"], out, tokenizer=tokenizer.model_path, executor="inprocess", task_bytes=40_000, **kw)
    assert s["ran"] == 1 and tree(out) == good


def test_shuffle_buffer_says_it_cannot_be_planned_and_builds_on_one_process(corpus, tokenizer, build_reference,
                                                                            tree, tmp_path):
    kw = settings(ALL_TOKENS, 5_000, 20_000)
    said = []
    s = run_build(corpus["paths"], tmp_path / "out", tokenizer=tokenizer.model_path, executor="processes",
                   shuffle_buffer=64, log=said.append, **kw)
    assert "cannot be cut into independent tasks; building inline, in this process" in said[0]
    assert s["executor"].startswith("inline")
    plan = make_plan(corpus["paths"], tokenizer=tokenizer)
    ref = build_reference(corpus["docs"], tmp_path / "ref", source=plan.describe(), shuffle_buffer=64, plan=plan, **kw)
    assert tree(tmp_path / "out") == tree(ref)


def test_dataset_shards_are_tasks_and_match_the_whole_stream(corpus, tokenizer, tree, tmp_path, monkeypatch):
    """A dataset id's shards are tasks; the hub is out of reach here, so the id's stream is two local JSON
    Lines files streamed by `datasets` itself (one shard per file)."""
    from datasets import load_dataset

    import niels_gpt.sources.records as records  # patched where the build looks it up

    files = [str(corpus["root"] / "a.jsonl"), str(tmp_path / "second.jsonl")]
    (tmp_path / "second.jsonl").write_text('{"text": "the second shard"}\n{"text": null}\n', encoding="utf-8")
    monkeypatch.setattr(records, "open_stream", lambda *a, **k: load_dataset("json", data_files=files, split="train",
                                                                             streaming=True))
    plan = make_plan(["someone/corpus"], tokenizer=tokenizer)
    assert [(p["kind"], p["start"], p["stop"]) for t in plan.tasks for p in t.pieces] == [("dataset", 0, 2),
                                                                                          ("dataset", 1, 2)]
    kw = settings(ALL_TOKENS, 5_000, 20_000)
    run_build(["someone/corpus"], tmp_path / "ref", tokenizer=tokenizer.model_path, executor="inline", **kw)
    run_build(["someone/corpus"], tmp_path / "out", tokenizer=tokenizer.model_path, executor="processes", workers=2,
               **kw)
    assert tree(tmp_path / "out") == tree(tmp_path / "ref")
    meta = read_meta(str(tmp_path / "out"))
    assert meta["streaming"] is True and meta["skipped"]["null_text"] == 1 + sum(
        json.loads(line)["text"] is None for line in open(files[0]) if line.strip())


def test_cli_build_and_plan_only(corpus, tokenizer, tmp_path, capsys):
    out = tmp_path / "cli"
    args = ["build", *map(str, corpus["paths"]), "--out", str(out), "--tokenizer", tokenizer.model_path,
            "--val-tokens", "5000", "--shard-bytes", "20KB", "--workers", "2", "--task-bytes", "40000",
            "--no-progress"]
    assert main(args + ["--plan-only"]) == 0
    printed = capsys.readouterr().out
    assert "tasks," in printed and "00000-" in printed
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "executor processes (2 workers)" in printed and "Mtok/s" in printed
    assert read_meta(str(out))["totals"]["val_tokens"] == 5000


def test_the_default_task_size_cuts_the_inputs_into_about_64_tasks(tokenizer, tmp_path, capsys):
    from niels_gpt.sources.stream import MIN_TASK_BYTES, TASK_BYTES, auto_task_bytes

    assert auto_task_bytes(0) == auto_task_bytes(185 * 10**6) == MIN_TASK_BYTES  # 4 MiB: fixed costs stay small
    assert auto_task_bytes(2**30) == 2**30 // 64  # 16 MiB: 64 tasks
    assert auto_task_bytes(10**12) == TASK_BYTES  # at most 64 MiB
    # ~9.4 MB of JSON Lines: three tasks of ~3.1 MB by default (one of 64 MiB before), the same plan each time
    line = json.dumps({"text": "word " * 200}) + "\n"
    path = tmp_path / "big.jsonl"
    path.write_text(line * (int(9.4e6) // len(line)))
    plan = make_plan([path], tokenizer=tokenizer)
    assert plan.task_bytes == MIN_TASK_BYTES and len(plan.tasks) == 3
    assert [t.id for t in make_plan([path], tokenizer=tokenizer).tasks] == [t.id for t in plan.tasks]
    assert len(make_plan([path], tokenizer=tokenizer, task_bytes=TASK_BYTES).tasks) == 1  # an explicit size holds
    assert main(["build", str(path), "--out", str(tmp_path / "out"), "--tokenizer", tokenizer.model_path,
                 "--plan-only"]) == 0
    assert f"3 tasks, {path.stat().st_size:,} input bytes; tasks of about {MIN_TASK_BYTES:,} bytes (the default " \
        in capsys.readouterr().out


@pytest.mark.parametrize("make, match, error", [
    (lambda d: d / "nothing.jsonl", r"nothing\.jsonl: no such file", SourceError),
    (lambda d: (d / "x.docx").write_text("a") and d / "x.docx", r"x\.docx: unknown file kind", SourceError),
    (lambda d: (d / "j.jsonl").write_text('{"text": "ok"}\n{"text": oops}\n') and d / "j.jsonl",
     r"j\.jsonl, line 2: not valid JSON", SourceError),
    (lambda d: (d / "k.jsonl").write_text('{"body": "ok"}\n') and d / "k.jsonl", r"k\.jsonl, line 1: no 'text' field", SourceError),
    (lambda d: (d / "u.jsonl").write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n') and d / "u.jsonl",
     r"u\.jsonl, line 2: not UTF-8 .*byte 28 of the file", SourceError),
    (lambda d: (d / "l.jsonl").write_text('["text"]\n') and d / "l.jsonl", r"l\.jsonl, line 1: a JSON list, not an object", SourceError),
])
def test_bad_inputs_fail_with_the_record_named(tokenizer, tmp_path, make, match, error):
    path = make(tmp_path)
    with pytest.raises(error, match=match):
        run_build([path], tmp_path / "out", tokenizer=tokenizer.model_path, executor="inprocess",
                   **settings(ALL_TOKENS, 10, 1 << 20))


def test_a_failed_rebuild_leaves_the_old_cache_exactly_as_it_was(corpus, tokenizer, tree, tmp_path):
    """The work directory lives beside the output (<out>.build): a rebuild that fails part-way
    leaves the old cache byte for byte, verify-clean, and its receipts where the rerun finds them."""
    from niels_gpt.report import verify_path

    out = tmp_path / "out"
    kw = settings(ALL_TOKENS, 5_000, 20_000)
    run_build(corpus["paths"], out, tokenizer=tokenizer.model_path, executor="inprocess", **kw)
    old = tree(out)
    bad = tmp_path / "zz-bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": oops}\n')
    with pytest.raises(SourceError, match=r"zz-bad\.jsonl, line 2"):
        run_build([*corpus["paths"], bad], out, tokenizer=tokenizer.model_path, executor="processes", workers=2,
                   task_bytes=40_000, **kw)
    assert tree(out) == old and verify_path(str(out)) == ([], 1)
    work = tmp_path / "out.build"
    assert (work / "plan.json").is_file() and list((work / "parts").glob("*.json"))
    bad.write_text('{"text": "fine"}\n{"text": "also fine"}\n')
    summary = run_build([*corpus["paths"], bad], out, tokenizer=tokenizer.model_path, executor="inprocess",
                         task_bytes=40_000, **kw)
    assert summary["reused"] > 0 and not work.exists() and verify_path(str(out)) == ([], 1)


def test_bad_parquet_inputs_are_named(tokenizer, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["a"]}), tmp_path / "nocol.parquet")
    with pytest.raises(SourceError, match=r"nocol\.parquet, row 0: no 'text' field \(fields: \['body'\]\); pass --text-field"):
        make_plan([tmp_path / "nocol.parquet"], tokenizer=tokenizer)
    pq.write_table(pa.table({"text": ["fine", "x"], "n": [1, 2]}).set_column(0, "text", pa.array([1, 2])),
                   tmp_path / "ints.parquet")
    with pytest.raises(SourceError, match=r"ints\.parquet, row 0: field 'text' is int, not text"):
        run_build([tmp_path / "ints.parquet"], tmp_path / "out", tokenizer=tokenizer.model_path,
                   executor="inprocess", **settings(ALL_TOKENS, 10, 1 << 20))
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(SourceError, match=r"junk\.parquet: not a readable Parquet file"):
        make_plan([tmp_path / "junk.parquet"], tokenizer=tokenizer)


def test_rejects_bad_settings(corpus, tokenizer, tmp_path):
    kw = settings(ALL_TOKENS, 10, 1 << 20)
    with pytest.raises(ConfigError, match="--executor 'threads': use one of auto, inline, processes, ray"):
        run_build(corpus["paths"], tmp_path / "o", tokenizer=tokenizer.model_path, executor="threads", **kw)
    with pytest.raises(ConfigError, match="no sources given"):
        run_build([], tmp_path / "o", tokenizer=tokenizer.model_path, **kw)
    with pytest.raises(ConfigError, match="task_bytes must be >= 1"):
        make_plan(corpus["paths"], tokenizer=tokenizer, task_bytes=0)
    with pytest.raises(ConfigError, match="--val-tokens -1: must be >= 0"):
        run_build(corpus["paths"], tmp_path / "o", tokenizer=tokenizer.model_path, executor="inprocess",
                   **{**kw, "val_tokens": -1})
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"text": ""}\n')
    with pytest.raises(ConfigError, match=r"no tokens for .*skipped: \{'empty_document': 1\}"):
        run_build([empty], tmp_path / "o", tokenizer=tokenizer.model_path, executor="inprocess", **kw)


def test_a_worker_with_another_tokenizer_file_is_refused(corpus, tokenizer, tmp_path):
    from niels_gpt.builders.tasks import run_task

    plan = make_plan(corpus["paths"][:1], tokenizer=tokenizer)
    with pytest.raises(TokenizerError, match="the plan was made with 0000000000000000…; give every node the same"):
        run_task(plan.tasks[0].to_json(), SPEC, tokenizer.model_path, "0" * 64, str(tmp_path))
    assert os.listdir(tmp_path) == []


def test_a_long_lived_worker_reopens_a_tokenizer_file_that_changed_since_it_opened_it(corpus, tokenizer, tmp_path):
    from types import SimpleNamespace

    from niels_gpt.builders import tasks

    plan = make_plan(corpus["paths"][:1], tokenizer=tokenizer)
    tasks.keep_tokenizer(tokenizer.model_path, SimpleNamespace(sha256="0" * 64))  # opened before the file changed
    receipt = tasks.run_task(plan.tasks[0].to_json(), SPEC, tokenizer.model_path, tokenizer.sha256, str(tmp_path))
    assert receipt["tokens"] > 0


def test_a_failed_rebuild_leaves_the_finished_cache_as_it_was(corpus, tokenizer, tree, tmp_path):
    out = tmp_path / "c"
    kw = settings(20_000, 2_000, 1 << 20)
    run_build(corpus["paths"], out, tokenizer=tokenizer.model_path, executor="inprocess", task_bytes=40_000, **kw)
    before = tree(out)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": 5}\n', encoding="utf-8")
    with pytest.raises(SourceError, match=r"bad\.jsonl, line 2"):
        run_build([bad, *corpus["paths"]], out, tokenizer=tokenizer.model_path, executor="inprocess",
                   task_bytes=40_000, **kw)
    assert tree(out) == before  # the commit ran into a staging directory that was never swapped in
    assert not list(tmp_path.glob("c.tmp-*")) and not list(tmp_path.glob("c.old-*"))


def test_a_url_output_is_uploaded_byte_identical_with_meta_json_last(corpus, tokenizer, tree, tmp_path):
    fsspec = pytest.importorskip("fsspec")
    kw = settings(20_000, 2_000, 1 << 20)
    local = tmp_path / "mine"
    run_build(corpus["paths"], local, tokenizer=tokenizer.model_path, executor="inprocess", task_bytes=40_000, **kw)
    url = "memory://dist-build-test/mine"
    summary = run_build(corpus["paths"], url, tokenizer=tokenizer.model_path, executor="inprocess",
                         work_dir=tmp_path / "work", task_bytes=40_000, **kw)
    assert summary["out"] == url
    fs = fsspec.filesystem("memory")
    remote = {p.split("/mine/", 1)[1]: fs.cat(p) for p in fs.find("/dist-build-test/mine")}
    assert remote == tree(local)
    assert not any(".build" in p for p in remote)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers die with their driver on Linux")
def test_worker_processes_die_with_a_killed_driver():
    script = textwrap.dedent("""
        import json, os, time
        from niels_gpt.builders.executors import make_executor
        ex = make_executor("processes", workers=2)
        for k in range(8):
            ex.submit(k, os.getpid)
        pids = set()
        while len(pids) < 2:
            pids |= {pid for _, pid, _ in ex.wait()}
            ex.submit(0, os.getpid)
        print(json.dumps(sorted(set(ex.pool._processes))), flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    try:
        pids = json.loads(proc.stdout.readline())
        assert len(pids) == 2 and all(process_alive(p) for p in pids)
    except BaseException:
        proc.kill()
        proc.wait(timeout=30)
        raise
    kill_and_check_workers_end(proc, pids, "worker processes outlived the dist-build driver that started them")


def test_a_receipt_hashes_each_byte_range_from_the_bytes_its_task_read(corpus, tokenizer, tmp_path, monkeypatch):
    import xxhash

    from niels_gpt.builders import tasks

    plan = make_plan(corpus["paths"], tokenizer=tokenizer, task_bytes=40_000)
    t = next(t for t in plan.tasks if t.pieces[0]["kind"] == ".jsonl" and t.pieces[0]["start"] > 0)
    monkeypatch.setattr(tasks, "digest", lambda piece: pytest.fail(f"{piece.where()} read again for its digest"))
    receipt = tasks.run_task(t.to_json(), SPEC, tokenizer.model_path, tokenizer.sha256, str(tmp_path))
    data = Path(t.pieces[0]["item"]).read_bytes()[t.pieces[0]["start"]:t.pieces[0]["stop"]]
    assert receipt["digests"] == ["xxh3_128:" + xxhash.xxh3_128(data).hexdigest()]
    part = (tmp_path / "parts" / f"{t.id}.bin").read_bytes()  # and its part, by what the commit checks
    assert receipt["files"]["bin"] == {"bytes": len(part), "xxh3_128": xxhash.xxh3_128(part).hexdigest()}
    monkeypatch.undo()
    assert tasks.load_receipt(tmp_path, t) == receipt  # a resume reads the range again: the same digest


def test_a_receipt_with_sha256_part_digests_runs_its_task_again(corpus, tokenizer, tmp_path):
    """Receipts written before parts were hashed with xxh3-128 name a sha256: not trusted, the task runs again."""
    import hashlib

    from niels_gpt.builders import tasks

    plan = make_plan(corpus["paths"], tokenizer=tokenizer, task_bytes=40_000)
    t = plan.tasks[0]
    receipt = tasks.run_task(t.to_json(), SPEC, tokenizer.model_path, tokenizer.sha256, str(tmp_path))
    assert tasks.load_receipt(tmp_path, t) == receipt
    for name, rec in receipt["files"].items():
        data = (tmp_path / "parts" / f"{t.id}{tasks.PART_SUFFIX[name]}").read_bytes()
        rec.pop("xxh3_128")
        rec["sha256"] = hashlib.sha256(data).hexdigest()
    (tmp_path / "parts" / f"{t.id}.json").write_text(json.dumps(receipt))
    assert tasks.load_receipt(tmp_path, t) is None


def test_the_commit_hashes_only_the_parts_it_did_not_see_written(corpus, tokenizer, tree, tmp_path, monkeypatch):
    """A part this run's workers on this host just wrote was hashed as written; a reused one is checked."""
    from niels_gpt.builders import commit

    hashed: list[int] = []
    real = commit.receipt_hash
    monkeypatch.setattr(commit, "receipt_hash", lambda data: hashed.append(1) or real(data))
    kw = dict(tokenizer=tokenizer.model_path, executor="inprocess", task_bytes=40_000, keep_parts=True,
              **settings(ALL_TOKENS, 5_000, 20_000))
    s = run_build(corpus["paths"], tmp_path / "out", **kw)
    assert s["ran"] >= 8 and hashed == []
    s = run_build(corpus["paths"], tmp_path / "out", **kw)
    assert s["ran"] == 0 and len(hashed) >= 2 * s["reused"]  # bin and lens (and origins) of each reused task


def test_a_parquet_tasks_receipt_hashes_its_row_groups_not_the_whole_file(tokenizer, tmp_path, monkeypatch):
    """A Parquet file cut into k tasks was hashed whole by each of them (k passes over the file, and again on a
    resume); a task's digest covers the footer and its own row groups, and changes when they do."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import xxhash

    from niels_gpt.builders import tasks
    from niels_gpt.sources import digests

    path = tmp_path / "big.parquet"
    texts = [f"document {i}: " + "words of a document " * 40 for i in range(400)]
    pq.write_table(pa.table({"text": texts}), path, row_group_size=20)
    plan = make_plan([path], tokenizer=tokenizer, task_bytes=40_000)
    ranged = [t for t in plan.tasks if t.pieces[0]["start"] > 0]
    assert len(plan.tasks) > 3 and ranged
    t = ranged[0]
    monkeypatch.setattr(digests, "sha256_file", lambda p: pytest.fail(f"{p} hashed whole for one task"))
    receipt = tasks.run_task(t.to_json(), SPEC, tokenizer.model_path, tokenizer.sha256, str(tmp_path / "w"))
    start, stop = t.pieces[0]["start"], t.pieces[0]["stop"]
    meta = pq.ParquetFile(path).metadata
    cols = [meta.row_group(g).column(c) for g in range(start, stop) for c in range(meta.num_columns)]
    lo = min(min(c.data_page_offset, c.dictionary_page_offset or c.data_page_offset) for c in cols)
    hi = max(min(c.data_page_offset, c.dictionary_page_offset or c.data_page_offset) + c.total_compressed_size
             for c in cols)
    data = path.read_bytes()
    footer = int.from_bytes(data[-8:-4], "little") + 8
    want = xxhash.xxh3_128(data[-footer:] + data[lo:hi]).hexdigest()
    assert receipt["digests"] == [f"xxh3_128:rowgroups:{start}-{stop}:{want}"]
    assert tasks.load_receipt(tmp_path / "w", t) == receipt  # a resume hashes the same bytes
    monkeypatch.undo()

    texts[start * 20] = texts[start * 20].replace("document", "DOCUMENT", 1)  # a row of this task's groups
    pq.write_table(pa.table({"text": texts}), path, row_group_size=20)
    assert tasks.load_receipt(tmp_path / "w", t) is None  # the task runs again

    path.write_bytes(data[:-100])  # a damaged footer: its whole-file digest, which no receipt holds
    assert tasks.load_receipt(tmp_path / "w", t) is None


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="counts bytes read with Linux's /proc/self/io")
def test_an_arrow_task_late_in_a_file_reads_its_own_batches_not_those_before(tmp_path):
    """A task numbers its rows from the rows before its batches: counted from their headers (the file mapped),
    not by reading every earlier batch (which made the k tasks of one file read it k/2 times over)."""
    import pyarrow as pa

    from niels_gpt.sources.records import pieces, records

    def rchar() -> int:
        return int(next(ln for ln in Path("/proc/self/io").read_text().splitlines() if ln.startswith("rchar")).split()[1])

    path = tmp_path / "many.arrow"
    texts = [f"document {i}: " + "words of a document " * 50 for i in range(4_000)]
    table = pa.table({"text": texts})
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        for b in table.to_batches(max_chunksize=20):
            w.write_batch(b)
    cut = pieces(path, 40_000)
    assert len(cut) > 50
    last = cut[-1]
    before = rchar()
    got = list(records(last, ["text"]))
    read = rchar() - before
    first = 20 * last.start
    assert [w for w, _ in got][:2] == [f"{path}, row {first}", f"{path}, row {first + 1}"]
    assert [r["text"] for _, r in got] == texts[first:first + len(got)]
    assert read < path.stat().st_size // 4, f"read {read:,} bytes of a {path.stat().st_size:,}-byte file for its last task"


def test_an_arrow_tasks_receipt_hashes_its_record_batches_not_the_whole_file(tokenizer, tmp_path, monkeypatch):
    import pyarrow as pa
    import xxhash

    from niels_gpt.builders import tasks
    from niels_gpt.sources import digests

    path = tmp_path / "big.arrow"

    def write(texts):
        table = pa.table({"text": texts})
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
            for b in table.to_batches(max_chunksize=20):
                w.write_batch(b)

    texts = [f"document {i}: " + "words of a document " * 40 for i in range(400)]
    write(texts)
    plan = make_plan([path], tokenizer=tokenizer, task_bytes=40_000)
    ranged = [t for t in plan.tasks if t.pieces[0]["start"] > 0]
    assert len(plan.tasks) > 3 and ranged and ranged[0].pieces[0]["kind"] == ".arrow"
    t = ranged[0]
    monkeypatch.setattr(digests, "sha256_file", lambda p: pytest.fail(f"{p} hashed whole for one task"))
    receipt = tasks.run_task(t.to_json(), SPEC, tokenizer.model_path, tokenizer.sha256, str(tmp_path / "w"))
    start, stop = t.pieces[0]["start"], t.pieces[0]["stop"]
    reader = pa.ipc.open_file(str(path))
    h = xxhash.xxh3_128(reader.schema.serialize())
    for b in range(start, stop):
        h.update(reader.get_batch(b).serialize())
    assert receipt["digests"] == [f"xxh3_128:batches:{start}-{stop}:{h.hexdigest()}"]
    assert tasks.load_receipt(tmp_path / "w", t) == receipt
    monkeypatch.undo()

    texts[start * 20] = texts[start * 20].replace("document", "DOCUMENT", 1)  # a row of this task's batches
    write(texts)
    assert tasks.load_receipt(tmp_path / "w", t) is None
