"""Golden bytes of pretraining caches built with each backend, and the same bytes from a plain reference.

The sha256s below were recorded from caches built before the encode pipeline was reworked for speed
(sub-batches on the worker threads, per-backend fast paths); every file of the cache, meta.json
included, must stay exactly the same for any worker count. (The meta.json digests were recorded again when
records began to carry their own checksum, `record_sha256`; the shards did not change.) The tokenizers are trained in-process on the
bundled sample corpus, so the recorded values hold for the pinned library versions; the reference check
(each document encoded alone with `encode`, its separator appended, the budgets cut by hand) does not
depend on them.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from niels_gpt.cache.build_cache import build_pretrain_cache
from niels_gpt.tokenizer import load_tokenizer

from ..conftest import sample_texts

pytest.importorskip("tokenizers")

VAL_TOKENS = 1_500
TRAIN_TOKENS = 40_000
SHARD_BYTES = 16_384


def golden_docs() -> list[str]:
    """Paragraphs of the sample corpus (many short documents), with empty and blank ones mixed in."""
    docs: list[str] = []
    for i, text in enumerate(sample_texts()):
        paras = text.split("\n\n")
        docs += paras
        docs += ["", "   \n"] if i % 2 else ["\t"]
    return docs


def cache_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def build(tok, out: Path, workers: int) -> dict[str, str]:
    build_pretrain_cache(golden_docs(), str(out), tokenizer=tok, max_train_tokens=TRAIN_TOKENS,
                         max_val_tokens=VAL_TOKENS, shard_bytes=SHARD_BYTES, seed=0, shuffle_buffer=None,
                         num_workers=workers, dataset_name="golden")
    return cache_digest(out)


def reference_tokens(tok, sep: int) -> tuple[list[int], list[int]]:
    """val and train tokens by the split rule, one document at a time."""
    out = {"val": [], "train": []}
    budgets = {"val": VAL_TOKENS, "train": TRAIN_TOKENS}
    for doc in golden_docs():
        if not doc.strip():
            continue
        split = "val" if len(out["val"]) < budgets["val"] else "train"
        if len(out[split]) >= budgets[split]:
            break
        ids = tok.encode(doc) + [sep]
        room = budgets[split] - len(out[split])
        if len(ids) > room:
            ids = ids[:room - 1] + [sep]
        out[split] += ids
    return out["val"], out["train"]


def shard_tokens(root: Path, split: str) -> list[int]:
    files = sorted((root / split).glob("shard_*.bin"))
    return np.concatenate([np.fromfile(f, dtype="<u2") for f in files]).tolist() if files else []


BPE_SHARDS = {  # tokenizer.json and .tiktoken of the same BPE write the same tokens
    "train/shard_00000.bin": "078f4a33db3cfac724166eefe996a88865beb6b887078ed4c4a36db356d23e6b",
    "train/shard_00001.bin": "46614d502d02462ffd2c6cfbdfbee5b70012c9c149084a8ecd0d6e5d3abc3faa",
    "train/shard_00002.bin": "b9898b5689cf7b90201dc301563614be7e3eb3de2bb77c0c860699028f1cf822",
    "train/shard_00003.bin": "5f961505ca43529361935e1dac2241f88019ceea921b50811e74d2c52cb74a84",
    "train/shard_00004.bin": "d5e4ef15236fa50dc81e87a346d62fd3f8b6a398d0a6421ca4be1d1ef3d4d382",
    "val/shard_00000.bin": "a8418a6765892ea94108274557aefffe286717f4303fb32d16f23e03cb6927cc",
}
GOLDEN = {
    "sentencepiece": {  # the library's default model, BPE with byte fallback
        "meta.json": "432135c81373914af14fb208badce282a3f7165229f855d0acfb080c91e81356",
        "train/shard_00000.bin": "bce50c0f0e3002b58c88915898258bbe22ef499bb190caebac7f2e966517e227",
        "train/shard_00001.bin": "c8b95b575e2cd830452b7d59da04ee71c68c7669d47342b0ca7274eaa373675c",
        "train/shard_00002.bin": "e677f3ef578c7312ebacb81eefdb51902289c9a06caa9ff754c7897a2d25d6e3",
        "train/shard_00003.bin": "7df96212b0d154fe77405e13de91ef3d8f71ed3917e20eff87e41e293eb5c551",
        "train/shard_00004.bin": "5fd3b85b81870639c3a002a49d0a32757eea80dcbda32459307c530d27b95e96",
        "val/shard_00000.bin": "645d91a0e4f8a07dc806798bd9e178cdc65bfc18519d77f74e58f7865c5a2a6a",
    },
    "sentencepiece-unigram": {  # --model-type unigram, the default before BPE: its shards have not moved
        "meta.json": "b8257392aff709fc3a05f919e09d976f3495fa9eea8ca8502947f277eb0751d0",
        "train/shard_00000.bin": "307252eca0a7146d8831698e6dab69969cdfa44d7afa08839e31a6fa85bd19af",
        "train/shard_00001.bin": "24165f048944d35933f59077faff959731bb1a8ca0f7ec1f877062a173d76d6a",
        "train/shard_00002.bin": "54fdb7f896a4dd97d6164ec34aafc6261526b6bc9f2e8e85cd49f1fee64483cd",
        "train/shard_00003.bin": "d85b0810fddb92a14ddec38d4a341a18f666913be1a1fa8d17a932c1cd52946f",
        "train/shard_00004.bin": "bc25cad936767ba002f098b113603e039c0e56a432e59deba6b49a81810d79b7",
        "val/shard_00000.bin": "40d7e36a31ff811761da67d42251b1fc9770272344dc28a1a9dce72e5fbe03e6",
    },
    "hf-tokenizers": {"meta.json": "ef153b3a19bc64585c261886dd94c01600fa2d3886ec0f29fa9dc61ba27beaed", **BPE_SHARDS},
    "tiktoken": {"meta.json": "361ed5af782af26bdd4b7f5ffe0610ef05af7f3eb44dd26def6365280f911344", **BPE_SHARDS},
}


@pytest.fixture(scope="module")
def unigram(tmp_path_factory):
    from niels_gpt.tokenizer import TrainSettings, train_tokenizer

    return train_tokenizer(sample_texts(), tmp_path_factory.mktemp("unigram"),
                           settings=TrainSettings(vocab_size=2000, model_type="unigram"))


@pytest.fixture(params=["sentencepiece", "sentencepiece-unigram", "hf-tokenizers", "tiktoken"])
def backend(request, tokenizer, unigram, bpe_json, tiktoken_file, monkeypatch):
    # the recorded meta.json is the reference encoder's (no `encoder` field); the fast encoder's caches are held
    # to these shards in test_fast_encoder.py
    monkeypatch.setenv("NIELS_GPT_ENCODER", "reference")
    if request.param == "tiktoken":
        pytest.importorskip("tiktoken")
    return request.param, {"sentencepiece": tokenizer, "sentencepiece-unigram": unigram,
                           "hf-tokenizers": load_tokenizer(bpe_json),
                           "tiktoken": load_tokenizer(tiktoken_file)}[request.param]


def test_cache_bytes_match_the_recorded_golden_for_any_worker_count(tmp_path, backend):
    name, tok = backend
    digests = [build(tok, tmp_path / f"w{w}", w) for w in (1, 2, 3)]
    assert digests[0] == digests[1] == digests[2]
    assert len([f for f in digests[0] if f.startswith("train/")]) > 2  # several shards, so rolls are covered
    assert digests[0] == GOLDEN[name], json.dumps(digests[0], indent=1)


def test_cache_tokens_are_each_document_encoded_alone(tmp_path, backend):
    _, tok = backend
    build(tok, tmp_path / "c", 2)
    sep = tok.separator.id
    val, train = reference_tokens(tok, sep)
    assert len(val) == VAL_TOKENS and len(train) == TRAIN_TOKENS  # both budgets cut a document
    assert shard_tokens(tmp_path / "c", "val") == val
    assert shard_tokens(tmp_path / "c", "train") == train
