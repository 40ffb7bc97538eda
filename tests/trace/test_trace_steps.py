"""The trace of a step is what the loader delivered in it: the traced sequences' tokens equal the rows the
trainer recorded, and each traced document's tokens in the cache equal the sequence's tokens at the traced
range; the reverse lookup finds every step the forward trace lists for a document."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from niels_gpt.errors import ConfigError
from niels_gpt.trace import trace_document, trace_step
from niels_gpt.trace.documents import cache_documents
from niels_gpt.train.train import TrainConfig, train

from ..train import test_world_size as world_runs
from ..train.test_new_order import other_order, rewrite_loader_state

ONES = torch.ones(2004, dtype=torch.int64)
TINY = dict(depth=1, n_embd=32, n_head=2, sequence_len=16, device_batch_size=4, eval_steps=1, log_every=0)


def _run(tmp_path: Path, data, steps: int, stop_at: int, **flags) -> tuple[Path, list]:
    """A run stopped after `stop_at` steps and resumed to `steps`; the rows its one rank read, per micro-batch."""
    cfg = {**TINY, "data": str(data), "out_dir": str(tmp_path / "run"), "steps": steps, **flags}
    first = train(TrainConfig(**cfg, stop_at=stop_at), token_bytes=ONES, record_rows=True, log=lambda *a: None)
    second = train(TrainConfig(**cfg, resume="latest"), token_bytes=ONES, record_rows=True, log=lambda *a: None)
    return tmp_path / "run", first.rows + second.rows


def check_documents(seq: dict) -> None:
    """Each document's tokens in its cache are the sequence's tokens at the traced range."""
    ids = np.asarray(seq["input_ids"])
    assert seq["documents"], seq
    for doc in seq["documents"]:
        a, b = doc["sequence_tokens"]
        if "bin" in doc:  # a packed bin's sequences are the bin's own tokens (checked against the rows)
            if "example" in doc:  # pack-sft's examples.npy: the SFT cache example it holds (its first tokens)
                docs = cache_documents(doc["source_cache"], "train")
                e0 = int(docs.starts[doc["example"]])
                np.testing.assert_array_equal(docs.tokens(e0, e0 + b - a), ids[a:b])
            continue
        docs = cache_documents(doc["cache"], doc["split"])
        d0, d1 = doc["cache_tokens"]
        start = seq["window"]["cache_tokens"][0] if "window" in seq else d0
        assert d0 <= start + a < start + b <= d1
        np.testing.assert_array_equal(docs.tokens(start + a, start + b), ids[a:b])
    covered = sorted(tuple(d["sequence_tokens"]) for d in seq["documents"])
    assert all(x[1] == y[0] for x, y in zip(covered[:-1], covered[1:], strict=True))  # documents tile the sequence


def check_run(run: Path, rows: list, steps: int, accum: int = 1) -> None:
    traced = []
    for step in range(1, steps + 1):
        t = trace_step(run, step)
        assert t["micro_batches"] == accum
        for m in range(accum):
            traced.append([s["input_ids"] for s in t["sequences"] if s["micro_batch"] == m])
        for seq in t["sequences"]:
            check_documents(seq)
    n = len(traced[0][0])
    assert traced == [[r[:n] for r in micro] for micro in rows]


@pytest.mark.parametrize("sampling", ["indexed", "shards", "random"])
def test_trace_of_a_pretraining_step_is_what_the_loader_delivered(tmp_path, pretrain_cache, sampling):
    run, rows = _run(tmp_path, pretrain_cache, 4, 2, sampling=sampling, shards_at_once=1)
    check_run(run, rows, 4)


def test_trace_of_an_sft_step_names_the_examples_and_their_trained_tokens(tmp_path, sft_cache):
    run, rows = _run(tmp_path, sft_cache, 3, 1)
    check_run(run, rows, 3)
    seq = trace_step(run, 2)["sequences"][0]
    doc = seq["documents"][0]
    assert 0 < doc["trained_tokens"] == sum(seq["trained"][slice(*doc["sequence_tokens"])])


def test_trace_of_packed_bins_lists_each_bins_sequences(tmp_path, packed_dir):
    run, rows = _run(tmp_path, packed_dir, 3, 1, sequence_len=32, device_batch_size=2)
    check_run(run, rows, 3)
    seq = trace_step(run, 1)["sequences"][0]
    assert [d["sequence_tokens"][0] for d in seq["documents"]][0] == 0 and len(seq["documents"]) >= 2
    assert all("example" in d for d in seq["documents"])


def test_trace_of_a_mixture_follows_its_phases(tmp_path, mixture_file):
    run, rows = _run(tmp_path, mixture_file, 5, 2)
    check_run(run, rows, 5)
    names = {d["dataset"] for s in range(1, 6) for q in trace_step(run, s)["sequences"] for d in q["documents"]}
    assert names == {"web", "books"}


def test_trace_after_a_resume_on_another_world_size(tmp_path, pretrain_cache):
    run_cfg = dict(world_runs.RUN)
    r0, r1 = world_runs.two_ranks(tmp_path, data=str(pretrain_cache), out_dir=str(tmp_path / "run"), stop_at=2,
                                  **run_cfg)
    resumed = train(TrainConfig(data=str(pretrain_cache), out_dir=str(tmp_path / "run"), resume="latest", **run_cfg),
                    token_bytes=ONES, record_rows=True, log=lambda *a: None)
    for step in (1, 2):  # two ranks, one micro-batch each
        t = trace_step(tmp_path / "run", step)
        assert t["world_size"] == 2
        for rank, rows in ((0, r0["rows"]), (1, r1["rows"])):
            assert [s["input_ids"] for s in t["sequences"] if s["rank"] == rank] == rows[step - 1]
        assert [s["input_ids"] for s in trace_step(tmp_path / "run", step, rank=1)["sequences"]] == r1["rows"][step - 1]
    for step in (3, 4):  # then one rank, two micro-batches
        t = trace_step(tmp_path / "run", step)
        assert (t["world_size"], t["micro_batches"]) == (1, 2)
        for m in range(2):
            assert [s["input_ids"] for s in t["sequences"] if s["micro_batch"] == m] == resumed.rows[(step - 3) * 2 + m]
        for seq in t["sequences"]:
            check_documents(seq)
    _reverse_agrees_with_forward(tmp_path / "run", 4)


def _name(d: dict) -> str:
    return f"{d['dataset'] + ':' if d.get('dataset') else ''}{d['split']}:{d['document']}"


def _reverse_agrees_with_forward(run: Path, steps: int, document: str | None = None) -> None:
    """document None: the first document of step 2's last sequence."""
    document = document or _name(trace_step(run, 2)["sequences"][-1]["documents"][0])
    forward = [(s, q["rank"], q["micro_batch"], q["row"]) for s in range(1, steps + 1)
               for q in trace_step(run, s)["sequences"]
               if any(_name(d) == document for d in q["documents"])]
    reverse = [(h["step"], h["rank"], h["micro_batch"], h["row"]) for h in trace_document(run, document)["steps"]]
    assert reverse == sorted(forward) and reverse, document


@pytest.mark.parametrize("data,flags", [
    ("pretrain_cache", {}), ("pretrain_cache", {"sampling": "random"}), ("sft_cache", {}),
    ("packed_dir", {"sequence_len": 32, "device_batch_size": 2}), ("mixture_file", {})])
def test_reverse_lookup_agrees_with_the_forward_trace(tmp_path, request, data, flags):
    run, _ = _run(tmp_path, request.getfixturevalue(data), 12, 5, **flags)
    _reverse_agrees_with_forward(run, 12)


def test_a_document_beyond_the_cache_is_refused(tmp_path, pretrain_cache):
    run, _ = _run(tmp_path, pretrain_cache, 2, 1)
    with pytest.raises(ConfigError, match=r"train:100000: .* holds documents train:0..train:\d+"):
        trace_document(run, "train:100000")


def test_trace_of_a_batch_ramp_follows_the_schedule(tmp_path, pretrain_cache):
    run, rows = _run(tmp_path, pretrain_cache, 6, 3, batch_ramp="2:8:24", device_batch_size=8)
    check_run(run, rows, 6)
    assert [len(trace_step(run, s)["sequences"]) for s in (1, 6)] == [2, 6]  # 2 rows a step from sample 0, 6 from sample 12


def test_trace_of_a_run_on_a_cache_at_a_url(tmp_path, pretrain_cache, download_cache):
    from ..conftest import http_server

    with http_server(pretrain_cache.parent) as base:
        url = f"{base}/{pretrain_cache.name}"
        run, rows = _run(tmp_path, url, 3, 1)
        check_run(run, rows, 3)
        assert trace_step(run, 2)["sequences"][0]["documents"][0]["cache"] == url


def test_trace_state_takes_a_loader_state_and_gives_the_next_batches(tmp_path, pretrain_cache):
    from niels_gpt.trace import trace_state
    from niels_gpt.train.data import TrainData
    from niels_gpt.train.train import load_checkpoint

    run, rows = _run(tmp_path, pretrain_cache, 3, 1)
    ckpt = load_checkpoint(run / "ckpt_000001.pt")
    sequences = trace_state(ckpt["loader"][0], ckpt["train_config"], micro_batches=[0, 1])
    assert [[s["input_ids"] for s in sequences if s["micro_batch"] == m] for m in (0, 1)] == rows[1:3]
    data = TrainData(pretrain_cache, T=16, batch_size=4, seed=ckpt["train_config"]["seed"], device="cpu", vocab_size=2004)
    data.load_state_dict(ckpt["loader"][0])
    bare = data.source.loader.batch_sampler.state_dict()  # a sampler's own state
    assert trace_state(bare, ckpt["train_config"]) == [s for s in sequences if s["micro_batch"] == 0]
    assert [s["input_ids"] for s in trace_state(None, ckpt["train_config"])] == rows[0]


@pytest.mark.parametrize("packing", ["bestfit", "contiguous"])
def test_trace_of_parquet_text_shards_names_file_row_group_and_row(tmp_path, tokenizer, packing):
    import pyarrow.parquet as pq

    from ..conftest import sample_texts
    from ..loading.conftest import write_parquet

    paras = [p for t in sample_texts() if t.strip() for p in t.split("\n\n") if p.strip()][:60]
    for i in range(2):
        write_parquet(tmp_path / "pq" / f"shard_{i:05d}.parquet", paras[i::2], row_group_size=8)
    run, rows = _run(tmp_path, tmp_path / "pq", 4, 2, tokenizer=str(tokenizer.model_path), packing=packing,
                     sequence_len=32)
    traced = [[s["input_ids"] for s in trace_step(run, n)["sequences"]] for n in range(1, 5)]
    assert traced == rows
    for seq in trace_step(run, 3)["sequences"]:
        ids = seq["input_ids"]
        for doc in seq["documents"]:
            text = pq.ParquetFile(doc["input"]).read_row_group(doc["row_group"]).column("text")[doc["row"]].as_py()
            whole = [tokenizer.bos_id, *tokenizer.encode(text)]
            a, b = doc["sequence_tokens"]
            part = ids[a:b]
            assert any(whole[i:i + len(part)] == part for i in range(len(whole) - len(part) + 1)), doc
            if packing == "bestfit":
                assert part == whole[:len(part)]  # every row places documents from their start
    doc = trace_step(run, 3)["sequences"][0]["documents"][0]
    steps = trace_document(run, f"rank0:{doc['document']}")["steps"]
    assert {"step": 3, "rank": 0, "micro_batch": 0, "row": 0, "sample": doc["document"]} in steps


def test_a_moved_cache_is_traced_with_data_and_the_cli_prints_each_document(tmp_path, pretrain_cache, capsys):
    import json
    import shutil

    from niels_gpt.cli import main

    cache = shutil.copytree(pretrain_cache, tmp_path / "a" / pretrain_cache.name)
    run, rows = _run(tmp_path, cache, 2, 1)
    moved = tmp_path / "b" / cache.name  # the fingerprint names the directory, not where it is
    moved.parent.mkdir()
    cache.rename(moved)
    assert main(["trace", str(run), "--step", "2", "--data", str(moved), "--json"]) == 0
    traced = json.loads(capsys.readouterr().out)
    assert [s["input_ids"] for s in traced["sequences"]] == rows[1]
    assert main(["trace", str(run), "--step", "2", "--rank", "0", "--data", str(moved)]) == 0
    out = capsys.readouterr().out.splitlines()
    first = traced["sequences"][0]["documents"][0]
    a, b = first["sequence_tokens"]
    assert out[0].startswith(f"step 2 of {run}: indexed data {moved}, 1 rank(s) x 1 micro-batch(es)")
    assert out[2].startswith(f"  [{a}:{b}) train:{first['document']} (tokens {first['cache_tokens'][0]}..")
    assert sum(line.startswith("rank 0 micro-batch 0 row") for line in out) == 4


@pytest.mark.parametrize("data", ["pretrain_cache", "mixture_file", "sft_cache"])  # a sampler's, a mixture's, a stream's
def test_a_checkpoint_whose_order_is_not_the_replayed_one_is_refused(tmp_path, request, data):
    """A resume compares a loader state's order digest with the order this code gives; trace did not, so a
    changed order (or an edited state) named documents the run never read."""
    run, _ = _run(tmp_path, request.getfixturevalue(data), 4, 2)
    trace_step(run, 3)
    rewrite_loader_state(run / "ckpt_000002.pt", other_order)  # the state the replay of step 3 starts from
    refused = (rf"{re.escape(str(run))}: ckpt_000002.pt records the data order of its run, and its settings "
               r"replayed here give another \(the same settings; the next samples' digest 000000000000\.\.\. -> "
               r"[0-9a-f]{12}\.\.\.\): .* trace the run with the niels_gpt release that trained it")
    with pytest.raises(ConfigError, match=refused):
        trace_step(run, 3)
    with pytest.raises(ConfigError, match=refused):
        trace_step(run, 1)  # the segment it ends
    with pytest.raises(ConfigError, match=refused):
        trace_document(run, "train:0" if data != "mixture_file" else "web:train:0")
