"""--val-per-input: documents cut at blank lines into pieces, so --val-frac draws val from inside every input
(five books give val pieces of each book, not one whole book); the same cache on every executor."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
import pytest

from niels_gpt.cache.cli import main
from niels_gpt.cache.meta import read_meta
from niels_gpt.sources.inputs import val_pieces
from niels_gpt.tokenizer import load_tokenizer

WORDS = "the river ran past the old mill and the miller counted his sacks of grain before the winter came".split()


def _books(d: Path, n: int = 5, paragraphs: int = 120) -> Path:
    """`n` text files (a "book" each) of `paragraphs` paragraphs, every paragraph tagged with its book."""
    d.mkdir()
    for k in range(n):
        paras = [f"book{k} part{i} " + " ".join(WORDS[(i + j) % len(WORDS)] for j in range(80))
                 for i in range(paragraphs)]
        (d / f"book{k}.txt").write_text("\n\n".join(paras) + "\n")
    return d


def _docs(cache: Path, split: str, tok) -> list[str]:
    shards = sorted((cache / split).glob("shard_*.bin"))
    ids = np.concatenate([np.fromfile(p, dtype=tok.token_dtype) for p in shards] or [np.zeros(0, tok.token_dtype)])
    cuts = np.flatnonzero(ids == tok.eot_id)
    return [tok.decode(d.tolist()) for d in np.split(ids, cuts + 1) if len(d)]


def _build(src, out, tok, *extra) -> int:
    return main(["build", str(src), "--out", str(out), "--tokenizer", tok.model_path, "--val-frac", "0.3",
                 "--seed", "7", "--no-progress", *extra])


def test_pieces_join_back_to_the_text_and_cut_only_after_blank_lines_past_the_size():
    text = "a" * 5000 + "\n\n" + "b" * 10 + "\n\n" + "c" * 5000 + "\n\n\n"
    assert val_pieces(text) == ["a" * 5000 + "\n\n", "b" * 10 + "\n\n" + "c" * 5000 + "\n\n\n"]
    assert val_pieces("short\n\ntext") == ["short\n\ntext"] and val_pieces("x" * 9000) == ["x" * 9000]
    long = "\n\n".join(f"paragraph {i} " + "w" * 300 for i in range(100))
    pieces = val_pieces(long, chars=1000)
    assert "".join(pieces) == long and all(len(p) >= 1000 and p.endswith("\n\n") for p in pieces[:-1])


def test_each_book_gives_val_pieces_where_without_the_flag_books_go_whole(tmp_path, tokenizer):
    tok = load_tokenizer(tokenizer.model_path)
    src = _books(tmp_path / "books")
    assert _build(src, tmp_path / "whole", tok) == 0
    whole = _docs(tmp_path / "whole", "val", tok) + _docs(tmp_path / "whole", "train", tok)
    assert len(whole) == 5  # one document per book: a book is in val whole or not at all (here: none is)
    assert _build(src, tmp_path / "per", tok, "--val-per-input") == 0
    val, train = _docs(tmp_path / "per", "val", tok), _docs(tmp_path / "per", "train", tok)
    in_val = {int(m) for d in val for m in re.findall(r"book(\d)", d)}
    in_train = {int(m) for d in train for m in re.findall(r"book(\d)", d)}
    assert in_val == in_train == set(range(5))  # every book in both splits
    assert all(len(set(re.findall(r"book(\d)", d))) == 1 for d in val + train)  # a piece never spans two books
    meta = read_meta(str(tmp_path / "per"))
    assert meta["source"]["val_per_input"] == 4096 and "val_per_input" in meta["split_rule"]
    share = meta["totals"]["val_tokens"] / (meta["totals"]["val_tokens"] + meta["totals"]["train_tokens"])
    assert 0.15 < share < 0.45


def _digest(cache: Path) -> str:
    files = sorted(p for p in cache.rglob("*") if p.is_file() and p.name != "meta.json")
    return hashlib.sha256(b"".join(p.name.encode() + p.read_bytes() for p in files)).hexdigest()


@pytest.fixture
def local_ray(request):
    """A one-machine Ray cluster for the `ray` case only."""
    if request.node.callspec.params["executor"] != "ray":
        yield None
        return
    ray = pytest.importorskip("ray")
    ctx = ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ctx.address_info["gcs_address"]
    ray.shutdown()


@pytest.mark.parametrize("executor", ["processes", "inprocess", "ray"])
def test_the_per_input_split_is_the_same_on_every_executor(tmp_path, tokenizer, executor, local_ray):
    from niels_gpt.builders.run import BuildSpec, build

    src = _books(tmp_path / "books", n=3, paragraphs=60)
    for name, how in (("inline", "inline"), ("other", executor)):
        summary = build(BuildSpec(sources=[str(src)], out=str(tmp_path / name), tokenizer=tokenizer.model_path, val_frac=0.3,
                        seed=7, val_per_input=True, executor=how, workers=2, task_bytes=20_000,
                        **({"ray_address": local_ray} if local_ray else {})), log=lambda m: None)
    if executor != "inprocess":  # it ran where it was asked to (inprocess names itself inline)
        assert summary["executor"].startswith(executor)
    assert _digest(tmp_path / "inline") == _digest(tmp_path / "other")
    a, b = read_meta(str(tmp_path / "inline")), read_meta(str(tmp_path / "other"))
    assert a["split_rule"] == b["split_rule"] and a["totals"] == b["totals"] and a["totals"]["val_tokens"] > 0
