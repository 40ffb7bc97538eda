"""Tiny caches of every kind the trainer reads, built with the real writers from hand-made tokens."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from niels_gpt.packing import pack_sft

from ..conftest import SPECIALS, write_pretrain_cache, write_sft_cache

VOCAB = 2004
TINY = dict(depth=1, n_embd=32, n_head=2, sequence_len=16, device_batch_size=4, eval_steps=2, log_every=0)


def tokens(n: int, seed: int) -> np.ndarray:
    """Documents of 20-60 random ids (>= 10), each closed by EOT: what a pretraining shard holds."""
    g = torch.Generator().manual_seed(seed)
    out = []
    while sum(map(len, out)) < n:
        k = int(torch.randint(20, 60, (1,), generator=g))
        out.append(torch.randint(10, VOCAB, (k,), generator=g).numpy())
        out.append(np.array([SPECIALS["eot"]]))
    return np.concatenate(out)[:n]


def chat(i: int, user_len: int, answer_len: int) -> list[int]:
    user = [100 + (i * 7 + k) % 900 for k in range(user_len)]
    answer = [1000 + (i * 13 + k) % 900 for k in range(answer_len)]
    return [SPECIALS["usr"], *user, SPECIALS["eot"], SPECIALS["asst"], *answer, SPECIALS["eot"]]


@pytest.fixture(scope="session")
def pretrain_cache(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pretrain") / "web"
    return write_pretrain_cache(out, {"train": [tokens(3000, 1), tokens(2000, 2)], "val": [tokens(600, 3)]})


@pytest.fixture(scope="session")
def second_cache(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pretrain") / "books"
    return write_pretrain_cache(out, {"train": [tokens(2500, 4)], "val": [tokens(400, 5)]})


@pytest.fixture(scope="session")
def mixture_file(tmp_path_factory, pretrain_cache, second_cache) -> Path:
    path = tmp_path_factory.mktemp("mix") / "mix.json"
    path.write_text(json.dumps({"seed": 3, "datasets": {"web": str(pretrain_cache), "books": str(second_cache)},
                                "phases": [{"start_step": 0, "weights": {"web": 0.75, "books": 0.25}},
                                           {"start_step": 3, "weights": {"web": 0.5, "books": 0.5}}]}))
    return path


@pytest.fixture(scope="session")
def sft_cache(tmp_path_factory) -> Path:
    train = [chat(i, 3 + i % 5, 2 + i % 7) for i in range(40)]
    val = [chat(100 + i, 4, 5) for i in range(8)]
    out = write_sft_cache(tmp_path_factory.mktemp("sft") / "chat", train, val)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["vocab_size"] == VOCAB
    return out


@pytest.fixture(scope="session")
def packed_dir(tmp_path_factory, sft_cache) -> Path:
    out = tmp_path_factory.mktemp("packed") / "bins"
    pack_sft(sft_cache, out, pack_size=TINY["sequence_len"] * 2, algorithm="ffd", on_overflow="truncate")
    return out
