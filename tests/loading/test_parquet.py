"""Streaming Parquet loader: rank striding, both packings, best-fit rules, exact resumption."""

import json
import re

import numpy as np
import pytest
import torch

from niels_gpt.errors import ConfigError, NielsGPTError, SourceError, StateError
from niels_gpt.loading import ParquetTokenLoader, list_parquet_files, split_files
from niels_gpt.loading.parquet import RankDocuments

from .conftest import write_parquet


def test_ranks_take_disjoint_row_groups_that_cover_every_document(parquet_dir, tokenizer, doc_texts):
    files = list_parquet_files(parquet_dir)
    W = 3
    seen = []
    for r in range(W):
        docs = RankDocuments(files, tokenizer, rank=r, world_size=W)
        assert docs.groups == [g for i, g in enumerate(RankDocuments(files, tokenizer, rank=0, world_size=1).groups)
                               if i % W == r]
        stream = docs.stream(0)
        seen += [tokenizer.decode(next(stream)[1][1:].tolist()) for _ in range(docs.docs_per_epoch)]
    assert sorted(seen) == sorted(doc_texts)


def test_contiguous_batches_are_the_document_stream_with_bos(parquet_dir, tokenizer, doc_texts):
    files = list_parquet_files(parquet_dir)
    loader = ParquetTokenLoader(files, tokenizer, B=2, T=50, packing="contiguous", rank=0, world_size=1)
    stream = [t for d in doc_texts for t in [tokenizer.bos_id] + tokenizer.encode(d)]
    got = []
    for _ in range(6):
        x, y = next(loader)
        assert x.shape == y.shape == (2, 50) and x.dtype == torch.int64
        assert torch.equal(x.flatten()[1:], y.flatten()[:-1])
        got += x.flatten().tolist()
    assert got == stream[:600]  # the last target of a batch is the first input of the next
    stats = loader.stats()  # full rows, nothing cropped (it said utilisation 0.0: the unused best-fit packer's)
    assert (stats["packing"], stats["utilisation"], stats["crop_fraction"]) == ("contiguous", 1.0, 0.0)


def reference_bestfit(docs: list[list[int]], rows: int, capacity: int, buffer_size: int):
    """nanochat's best-fit loop written plainly (linear scans), refilling one document at a time."""
    it = iter(docs)
    buf, out, cropped = [], [], 0
    for _ in range(rows):
        row = []
        while len(row) < capacity:
            while len(buf) < buffer_size:
                buf.append(next(it))
            remaining = capacity - len(row)
            best, best_len = -1, 0
            for i, d in enumerate(buf):
                if best_len < len(d) <= remaining:
                    best, best_len = i, len(d)
            if best >= 0:
                row += buf.pop(best)
            else:
                short = min(range(len(buf)), key=lambda i: len(buf[i]))
                d = buf.pop(short)
                row += d[:remaining]
                cropped += len(d) - remaining
        out.append(row)
    return out, cropped


@pytest.mark.parametrize("T,buffer_size", [(64, 8), (200, 20), (31, 1)])
def test_bestfit_rows_start_with_bos_and_match_the_reference(parquet_dir, tokenizer, doc_texts, T, buffer_size):
    files = list_parquet_files(parquet_dir)
    loader = ParquetTokenLoader(files, tokenizer, B=4, T=T, packing="bestfit", buffer_size=buffer_size,
                                rank=0, world_size=1)
    rows = []
    for _ in range(5):
        x, y = next(loader)
        assert (x[:, 0] == tokenizer.bos_id).all()
        assert torch.equal(x[:, 1:], y[:, :-1])
        rows += torch.cat([x, y[:, -1:]], dim=1).tolist()
    docs = [[tokenizer.bos_id] + tokenizer.encode(d) for d in doc_texts] * 3
    ref, cropped = reference_bestfit(docs, 20, T + 1, buffer_size)
    assert rows == ref
    stats = loader.stats()
    assert stats["utilisation"] == 1.0 and stats["tokens_cropped"] == cropped
    assert stats["crop_fraction"] == cropped / (20 * (T + 1) + cropped)


@pytest.mark.parametrize("packing", ["contiguous", "bestfit"])
def test_resume_at_a_random_step_continues_exactly(parquet_dir, tokenizer, packing):
    files = list_parquet_files(parquet_dir)

    def make():
        return ParquetTokenLoader(files, tokenizer, B=3, T=40, packing=packing, buffer_size=12, rank=1, world_size=2,
                                  tokenizer_batch_size=5)

    ref = make()
    full = [next(ref) for _ in range(60)]  # more than one epoch of rank 1's documents
    stop = int(torch.randint(5, 50, (1,), generator=torch.Generator().manual_seed(len(packing))))
    first = make()
    for _ in range(stop):
        next(first)
    state = json.loads(json.dumps(first.state_dict()))
    resumed = make()
    resumed.load_state_dict(state)
    for want in full[stop:]:
        got = next(resumed)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_state_of_another_rank_packing_or_corpus_is_rejected(parquet_dir, tokenizer, tmp_path, doc_texts):
    files = list_parquet_files(parquet_dir)
    state = ParquetTokenLoader(files, tokenizer, B=1, T=8, rank=0, world_size=2).state_dict()
    with pytest.raises(StateError, match="each rank must load its own state"):
        ParquetTokenLoader(files, tokenizer, B=1, T=8, rank=1, world_size=2).load_state_dict(state)
    with pytest.raises(StateError, match="'packing': 'bestfit'"):
        ParquetTokenLoader(files, tokenizer, B=1, T=8, packing="contiguous", rank=0,
                           world_size=2).load_state_dict(state)
    other = [write_parquet(tmp_path / "x.parquet", doc_texts[:40], 8)]
    with pytest.raises(StateError, match="does not match"):
        ParquetTokenLoader(other, tokenizer, B=1, T=8, rank=0, world_size=2).load_state_dict(state)


def test_too_few_row_groups_for_the_world_size_is_rejected(tmp_path, tokenizer, doc_texts):
    f = write_parquet(tmp_path / "a.parquet", doc_texts[:10], 5)
    with pytest.raises(ConfigError, match="2 row groups in 1 file\\(s\\) for world_size 3"):
        ParquetTokenLoader([f], tokenizer, B=1, T=8, rank=0, world_size=3)


def test_missing_text_column_and_null_text_are_rejected(tmp_path, tokenizer):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["a", "b"]}), tmp_path / "a.parquet")
    with pytest.raises(SourceError, match="a.parquet: no column 'text'"):
        ParquetTokenLoader([tmp_path / "a.parquet"], tokenizer, B=1, T=8, rank=0, world_size=1)
    pq.write_table(pa.table({"text": ["a b c d e f g h i j", None]}), tmp_path / "n.parquet")
    loader = ParquetTokenLoader([tmp_path / "n.parquet"], tokenizer, B=1, T=4, packing="contiguous", rank=0,
                                world_size=1)
    with pytest.raises(SourceError, match="n.parquet: row group 0, row 1: null 'text'"):
        next(loader)


def test_split_takes_the_last_shard_as_val(parquet_dir, tmp_path):
    assert [p.name for p in split_files(parquet_dir, "val")] == ["shard_00002.parquet"]
    assert [p.name for p in split_files(parquet_dir, "train")] == ["shard_00000.parquet", "shard_00001.parquet"]
    (tmp_path / "shard_00000.parquet.tmp").write_bytes(b"partial")
    with pytest.raises(SourceError, match="0 Parquet shard\\(s\\)"):
        split_files(tmp_path, "train")


def test_bad_packing_is_rejected(parquet_dir, tokenizer):
    with pytest.raises(ConfigError, match="packing 'greedy'"):
        ParquetTokenLoader(list_parquet_files(parquet_dir), tokenizer, B=1, T=8, packing="greedy")


def test_row_cropping_keeps_every_row_full(parquet_dir, tokenizer):
    loader = ParquetTokenLoader(list_parquet_files(parquet_dir), tokenizer, B=8, T=16, buffer_size=4,
                                rank=0, world_size=1)
    x, _ = next(loader)
    assert x.shape == (8, 16) and (x[:, 0] == tokenizer.bos_id).all()
    assert loader.stats()["docs_cropped"] > 0 and np.isclose(loader.stats()["utilisation"], 1.0)


def _same(a, b) -> bool:
    return all(torch.equal(p[0], q[0]) and torch.equal(p[1], q[1]) for p, q in zip(a, b, strict=True))


@pytest.mark.parametrize("packing,mode,depth", [("bestfit", "thread", 1), ("bestfit", "thread", 5),
                                                ("bestfit", "process", 3), ("contiguous", "thread", 2),
                                                ("contiguous", "process", 1)])
def test_prefetching_hands_out_the_same_batches_and_the_state_of_those_handed_out(parquet_dir, tokenizer, packing,
                                                                                 mode, depth):
    """0 -> N batches with a stop at k (state saved, a new loader resumed) == N straight, at any depth."""
    files = list_parquet_files(parquet_dir)

    def make(**kw):
        return ParquetTokenLoader(files, tokenizer, B=3, T=40, packing=packing, buffer_size=12, rank=0,
                                  world_size=1, **kw)

    sync = make()
    straight = [next(sync) for _ in range(14)]
    ahead = make(prefetch=depth, prefetch_mode=mode)
    first = [next(ahead) for _ in range(6)]
    state = json.loads(json.dumps(ahead.state_dict()))
    ahead.close()
    check = make()
    for _ in range(6):
        next(check)
    assert state == check.state_dict()  # the position of the batches handed out, not of those prefetched
    resumed = make(prefetch=depth, prefetch_mode=mode)
    resumed.load_state_dict(state)
    assert _same(first + [next(resumed) for _ in range(8)], straight)
    # a state loaded while the producer is running restarts it there
    resumed.load_state_dict(state)
    assert _same([next(resumed) for _ in range(3)], straight[6:9])
    resumed.close()


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_an_error_in_the_background_is_raised_in_the_loop(tmp_path, tokenizer, mode):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["a b c d e f g h i j", None]}), tmp_path / "n.parquet")
    loader = ParquetTokenLoader([tmp_path / "n.parquet"], tokenizer, B=1, T=4, packing="contiguous", rank=0,
                                world_size=1, prefetch=2, prefetch_mode=mode)
    with pytest.raises(SourceError, match="n.parquet: row group 0, row 1: null 'text'"):
        next(loader)


def test_a_killed_prefetch_process_is_reported_not_waited_for(parquet_dir, tokenizer):
    import os
    import signal

    loader = ParquetTokenLoader(list_parquet_files(parquet_dir), tokenizer, B=2, T=16, rank=0, world_size=1,
                                prefetch=2, prefetch_mode="process")
    next(loader)
    os.kill(loader._ahead._worker.pid, signal.SIGKILL)
    loader._ahead._worker.join()
    with pytest.raises(NielsGPTError, match="killed from outside"):
        for _ in range(10):  # what it queued before dying is still handed out
            next(loader)


def test_the_mode_follows_whether_the_encoder_releases_the_gil(tokenizer):
    from niels_gpt.loading.ahead import resolve_mode
    from niels_gpt.tokenizer.base import Tokenizer

    assert resolve_mode("auto", tokenizer) == "thread"  # sentencepiece's batch encoder is native

    class PythonLoop(type(tokenizer)):
        encode_batch = Tokenizer.encode_batch

    plain = PythonLoop.__new__(PythonLoop)
    assert resolve_mode("auto", plain) == "process"
    assert resolve_mode("thread", plain) == "thread"
    with pytest.raises(ConfigError, match="prefetch mode 'fork'"):
        resolve_mode("fork", tokenizer)
    with pytest.raises(ConfigError, match="prefetch -1"):
        ParquetTokenLoader([], tokenizer, B=1, T=8, prefetch=-1)


def test_an_epoch_over_2000_files_reads_under_the_default_descriptor_limit(tmp_path, tokenizer):
    import resource

    import pyarrow as pa
    import pyarrow.parquet as pq

    n = 2000
    for i in range(n):
        pq.write_table(pa.table({"text": [f"doc {i}"]}), tmp_path / f"shard_{i:05d}.parquet")
    files = list_parquet_files(tmp_path)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
    try:
        loader = ParquetTokenLoader(files, tokenizer, B=4, T=64, packing="contiguous", rank=0, world_size=1)
        seen = []
        while loader.state_dict()["next_doc"] < n:
            x, _ = next(loader)
            seen += x.flatten().tolist()
        loader.close()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    bos = tokenizer.bos_id
    docs = [tokenizer.decode(d) for d in np.split(np.array(seen), np.flatnonzero(np.array(seen) == bos))[1:]]
    assert docs[:n - 1] == [f"doc {i}" for i in range(n - 1)]


@pytest.mark.parametrize("packing", ["contiguous", "bestfit"])
@pytest.mark.parametrize("sizes, said", [({"B": 2.0}, "B=2.0 (float) is not a batch size"),
                                         ({"T": "8"}, "T='8' (str) is not a window length"),
                                         ({"buffer_size": 0}, "buffer_size=0 is not a buffer size"),
                                         ({"tokenizer_batch_size": 0}, "tokenizer_batch_size=0 is not a batch size")])
def test_sizes_that_are_not_positive_ints_are_refused_by_name(parquet_dir, tokenizer, packing, sizes, said):
    """B=2.0 made a loader whose first batch failed inside numpy (a float shape); T='8' failed comparing a str
    with an int; tokenizer_batch_size=0 failed in range(). Each is refused on construction, naming the argument,
    as the cache readers do."""
    kwargs = {"B": 1, "T": 8, **sizes}
    with pytest.raises(ConfigError, match=r"ParquetTokenLoader: " + re.escape(said)):
        next(ParquetTokenLoader(list_parquet_files(parquet_dir), tokenizer, packing=packing, prefetch=0, **kwargs))


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_closed_prefetching_loader_goes_on_after_the_last_batch_it_delivered(parquet_dir, tokenizer, mode):
    """close() dropped the batches made ahead, and a next() after it started the producer again where it stood: a
    thread skipped the dropped batches, a process started over from the first batch. It goes on after the last
    batch delivered, as ResumableDataLoader does after close()."""
    files = list_parquet_files(parquet_dir)
    straight = ParquetTokenLoader(files, tokenizer, B=2, T=16, rank=0, world_size=1, prefetch=0)
    want = [next(straight)[0] for _ in range(6)]
    loader = ParquetTokenLoader(files, tokenizer, B=2, T=16, rank=0, world_size=1, prefetch=3, prefetch_mode=mode)
    got = [next(loader)[0] for _ in range(3)]
    loader.close()
    got += [next(loader)[0] for _ in range(3)]
    loader.close()
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_parquet_files_given_by_url_are_refused_as_urls(tokenizer):
    """A URL in `files` was read as the local path "s3:/b/..." and refused as a broken file to re-download; the loader
    reads local shards (`download` fetches them), and says so. No file at all is refused too."""
    for files in (["s3://bucket/fineweb/shard_00000.parquet"], []):
        with pytest.raises(ConfigError, match=r"expected local files \(`download` fetches shards from a URL\)"):
            ParquetTokenLoader(files, tokenizer, B=1, T=8, rank=0, world_size=1, prefetch=0)
