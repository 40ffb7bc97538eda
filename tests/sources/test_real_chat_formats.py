"""The real OpenAssistant export converted as a user would (to ShareGPT, and to OpenAI content-part messages)
builds with --chat into the cache the export itself builds; five real Project Gutenberg books with
--val-per-input give val pieces of every book. Skipped where ../shared/data is absent."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from niels_gpt.cache.cli import main
from niels_gpt.cache.meta import read_meta

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
TREES = DATA / "oasst1" / "oasst_pre_release.en_100_tree.jsonl"
pytestmark = [pytest.mark.real_data, pytest.mark.skipif(not DATA.exists(), reason=f"{DATA} is absent")]
SHAREGPT_FROM = {"system": "system", "user": "human", "assistant": "gpt"}


def _best_paths() -> list[list[dict]]:
    from niels_gpt.sources.corpus import corpus

    return list(corpus([TREES], layout="oasst", chat=True).iter_conversations())


def _write(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def _cache_bytes(d: Path) -> dict[str, bytes]:
    # the origins name each example's input and record: other files, other origins
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())
            if p.name != "meta.json" and not p.name.endswith(("origins.npy", "origins.json"))}


def test_oasst_as_sharegpt_and_as_openai_parts_builds_the_cache_of_the_export(tmp_path, tokenizer):
    convs = _best_paths()
    sharegpt = _write(tmp_path / "oasst-sharegpt.jsonl", [
        {"conversations": [{"from": SHAREGPT_FROM[m["role"]], "value": m["content"]} for m in c]} for c in convs])
    parts = _write(tmp_path / "oasst-openai.jsonl", [
        {"messages": [{"role": m["role"], "content": [{"type": "text", "text": m["content"]}]} for m in c]}
        for c in convs])
    caches = {}
    for name, src in (("trees", TREES), ("sharegpt", sharegpt), ("openai", parts)):
        assert main(["build", str(src), "--chat", "--out", str(tmp_path / name), "--tokenizer", tokenizer.model_path,
                     "--val-frac", "0.1", "--no-progress"]) == 0
        caches[name] = _cache_bytes(tmp_path / name)
    meta = {n: read_meta(str(tmp_path / n)) for n in caches}
    assert meta["sharegpt"]["source"]["layouts"] == ["sharegpt"] and meta["openai"]["source"]["layouts"] == ["messages"]
    assert meta["trees"]["totals"]["train_examples"] + meta["trees"]["totals"]["val_examples"] == 100
    assert caches["sharegpt"] == caches["trees"] and caches["openai"] == caches["trees"]


def test_five_real_books_each_give_val_pieces_with_val_per_input(tmp_path, tokenizer):
    from niels_gpt.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer.model_path)
    names = ["Alice-s-Adventures-in-Wonderland_11.txt", "Frankenstein_84.txt", "The-Adventures-of-Sherlock-Holmes_1661.txt",
             "Adventures-of-Huckleberry-Finn_76.txt", "Pride-and-Prejudice_1342.txt"]
    books = [DATA / "gutenberg" / n for n in names]
    assert main(["build", *map(str, books), "--out", str(tmp_path / "c"), "--tokenizer", tokenizer.model_path,
                 "--val-frac", "0.05", "--val-per-input", "--max-tokens", "20000", "--no-progress"]) == 0
    meta = read_meta(str(tmp_path / "c"))
    assert meta["source"]["layouts"] == ["gutenberg"] and meta["source"]["val_per_input"] == 4096
    ids = np.concatenate([np.fromfile(p, dtype=tok.token_dtype) for p in sorted((tmp_path / "c" / "val").glob("*.bin"))])
    pieces = [tok.decode(d.tolist()) for d in np.split(ids, np.flatnonzero(ids == tok.eot_id) + 1) if len(d)]
    texts = [re.sub(r"\r\n?", "\n", b.read_text(encoding="utf-8-sig")) for b in books]
    owners = [[k for k, t in enumerate(texts) if p[:200] in t] for p in pieces]
    assert all(len(o) == 1 for o in owners)  # each val piece is text of exactly one book
    assert {o[0] for o in owners} == set(range(5))  # and every book gave val some
    assert meta["totals"]["val_documents"] == len(pieces) > 5
