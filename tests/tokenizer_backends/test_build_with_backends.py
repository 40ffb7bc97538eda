"""Pretraining caches built with each backend: the tokenizer's own separator, recorded and read back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from niels_gpt.cache.build_cache import build_pretrain_cache
from niels_gpt.cache.meta import read_meta
from niels_gpt.cache.pretrain_dataset import PretrainTokenStreamDataset
from niels_gpt.tokenizer import load_tokenizer

from ..conftest import sample_texts

pytest.importorskip("tokenizers")

DOCS = ["first document.", "a second, longer document with 123 digits.", "  ", "third «one» 🦜"]


def build(tok, out, docs=DOCS, **kw):
    args = dict(tokenizer=tok, max_train_tokens=10_000, max_val_tokens=0, shard_bytes=1 << 20, seed=0,
                shuffle_buffer=None)
    args.update(kw)
    build_pretrain_cache(docs, str(out), **args)
    return np.fromfile(out / "train" / "shard_00000.bin", dtype="<u2"), read_meta(str(out))


def test_user_tokenizer_ends_every_document_with_its_own_eos(tmp_path, bpe_json):
    tok = load_tokenizer(bpe_json)
    eos = tok.token_to_id("<|endoftext|>")
    tokens, meta = build(tok, tmp_path / "c")
    expected = [i for d in DOCS if d.strip() for i in tok.encode(d) + [eos]]
    assert tokens.tolist() == expected
    assert meta["document_separator"] == {"token": "eot", "id": eos, "position": "after every document"}
    assert meta["special_token_ids"] == {"sys": None, "usr": None, "asst": None, "eot": eos}
    assert meta["tokenizer"]["conventions"] == "own" and meta["skipped"] == {"empty_document": 1}
    ds = PretrainTokenStreamDataset(str(tmp_path / "c" / "train"), T=8, device="cpu")
    x, y = ds.get_batch(B=2, generator=torch.Generator().manual_seed(0))
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_bos_separator_starts_every_document_and_is_recorded(tmp_path, bpe_json):
    tok = load_tokenizer(bpe_json, bos="<|im_start|>", separator="bos")
    bos = tok.token_to_id("<|im_start|>")
    tokens, meta = build(tok, tmp_path / "c")
    assert tokens.tolist() == [i for d in DOCS if d.strip() for i in [bos] + tok.encode(d)]
    assert meta["document_separator"] == {"token": "bos", "id": bos, "position": "before every document"}
    assert meta["tokenizer"]["options"] == {"bos": "<|im_start|>", "separator": "bos"}
    assert "keeps its BOS" in meta["split_rule"]


def test_bos_separator_cut_keeps_the_bos_and_the_first_tokens(tmp_path, bpe_json):
    tok = load_tokenizer(bpe_json, bos="<|im_start|>", separator="bos")
    bos = tok.token_to_id("<|im_start|>")
    first = [bos] + tok.encode(DOCS[0])
    tokens, meta = build(tok, tmp_path / "c", max_train_tokens=len(first) + 3)
    assert tokens.tolist() == first + [bos] + tok.encode(DOCS[1])[:2]
    assert meta["cuts"]["train"]["kept_tokens"] == 3


def test_tiktoken_and_tokenizer_json_of_the_same_bpe_build_identical_shards(tmp_path, bpe_json, tiktoken_file):
    docs = sample_texts()
    a, meta_a = build(load_tokenizer(bpe_json), tmp_path / "hf", docs)
    b, meta_b = build(load_tokenizer(tiktoken_file), tmp_path / "tt", docs)
    assert np.array_equal(a, b) and len(a) > 1000
    assert meta_b["tokenizer"]["backend"] == "tiktoken"


def test_output_is_identical_for_any_worker_count(tmp_path, tiktoken_file, bpe_json):
    docs = sample_texts() * 3
    for path in (tiktoken_file, bpe_json):
        tok = load_tokenizer(path)
        one, _ = build(tok, tmp_path / "w1", docs, num_workers=1, dataset_name="d")
        two, _ = build(tok, tmp_path / "w2", docs, num_workers=2, dataset_name="d")
        assert np.array_equal(one, two)
        assert (tmp_path / "w1" / "meta.json").read_bytes() == (tmp_path / "w2" / "meta.json").read_bytes()


def test_library_sentencepiece_cache_keeps_our_eot(tmp_path, tokenizer):
    tokens, meta = build(tokenizer, tmp_path / "c")
    assert meta["document_separator"] == {"token": "eot", "id": tokenizer.eot_id, "position": "after every document"}
    assert "conventions" not in meta["tokenizer"]
    assert tokens.tolist() == [i for d in DOCS if d.strip() for i in tokenizer.encode(d) + [tokenizer.eot_id]]


def test_rejects_building_with_a_tokenizer_that_has_no_separator(tmp_path):
    import tokenizers

    from niels_gpt.errors import TokenizerError

    t = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    t.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(TokenizerError, match=r"tokenizer.json: no end-of-text token found"):
        build(load_tokenizer(tmp_path / "tokenizer.json"), tmp_path / "c")
    assert not (tmp_path / "c" / "meta.json").exists()


def test_dist_build_tasks_open_a_tiktoken_encoding_by_its_name(tmp_path, monkeypatch, tiktoken_file, tokenizer):
    """A task is told the tokenizer by name when it is a name (a Ray worker opens it there), by absolute path
    when it is a file; a task in a fresh worker (nothing kept from the driver) opens the name and runs."""
    import json

    tiktoken = pytest.importorskip("tiktoken")
    from tiktoken.load import load_tiktoken_bpe

    from niels_gpt.builders import make_plan
    from niels_gpt.builders import tasks as tasks_module
    from niels_gpt.builders.parallel import tokenizer_ref
    from niels_gpt.tokenizer.tiktoken_backend import CL100K_PATTERN

    ranks = load_tiktoken_bpe(str(tiktoken_file))
    tiktoken.registry.list_encoding_names()
    monkeypatch.setitem(tiktoken.registry.ENCODING_CONSTRUCTORS, "sample_base", lambda: {
        "name": "sample_base", "pat_str": CL100K_PATTERN, "mergeable_ranks": ranks,
        "special_tokens": {"<|endoftext|>": len(ranks)}})
    named = load_tokenizer("sample_base")
    monkeypatch.chdir(tmp_path)
    assert tokenizer_ref(named) == "sample_base"
    assert tokenizer_ref(tokenizer) == str(Path(tokenizer.model_path).resolve())
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in sample_texts()[:4]))
    plan = make_plan([src], tokenizer=named)
    monkeypatch.setattr(tasks_module, "_TOKENIZERS", {})  # a worker that never saw the driver's tokenizer
    spec = {"rules": plan.rules._asdict(), "chat": False}
    receipt = tasks_module.run_task(plan.tasks[0].to_json(), spec, tokenizer_ref(named), named.sha256,
                                    str(tmp_path / "work"))
    want = sum(len(named.encode(t)) + 1 for t in sample_texts()[:4] if t.strip())
    assert receipt["tokens"] == want
