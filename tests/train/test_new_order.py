"""train --allow-new-order: a resume whose data order changed (the cache rebuilt, the order's code or position
not the run's) is refused naming what differs and the flag; with the flag the loader goes on from the
checkpoint's position in the new order, and run.json records the step and what changed. A state without an
order record (an older checkpoint) resumes as before."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from niels_gpt.errors import StateError
from niels_gpt.train.checkpoint import save_checkpoint
from niels_gpt.train.train import TrainConfig, train

from ..conftest import write_pretrain_cache
from .conftest import TINY, tokens
from .test_resume import TOKEN_BYTES

STEPS = 4


def run(data, out, **kw):
    cfg = TrainConfig(data=str(data), out_dir=str(out), steps=STEPS, **{**TINY, **kw})
    return train(cfg, token_bytes=TOKEN_BYTES, log=lambda *a: None)


def rewrite_loader_state(ckpt_path, change) -> None:
    """The checkpoint with `change` applied to every dict of its loader states, saved as the trainer saves."""
    raw = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    raw.pop("sha256"), raw.pop("version")

    def walk(obj):
        if isinstance(obj, dict):
            change(obj)
            for v in list(obj.values()):
                walk(v)
        elif isinstance(obj, list):
            for v in obj:
                walk(v)

    walk(raw["loader"])
    save_checkpoint(ckpt_path, raw)


def other_order(d: dict) -> None:  # the next samples the state says it delivers are not this code's
    if isinstance(d.get("digest"), str):
        d["digest"] = "0" * len(d["digest"])


def no_order(d: dict) -> None:  # a state written before states carried their order
    d.pop("order", None)
    for key in [k for k, v in d.items() if isinstance(v, dict) and "digest" in v]:
        d.pop(key)


KINDS = {"indexed": ("pretrain_cache", {}), "windows": ("pretrain_cache", {"sampling": "random"}),
         "shards": ("pretrain_cache", {"sampling": "shards"}), "mixture": ("mixture_file", {}),
         "sft": ("sft_cache", {}), "packed": ("packed_dir", {"sequence_len": 32})}


@pytest.mark.parametrize("kind", KINDS)
def test_a_changed_order_is_refused_naming_the_flag_and_goes_on_with_it(tmp_path, kind, request):
    data = request.getfixturevalue(KINDS[kind][0])
    kw = KINDS[kind][1]
    run(data, tmp_path / "run", stop_at=2, **kw)
    ckpt = tmp_path / "run" / "ckpt_000002.pt"
    rewrite_loader_state(ckpt, other_order)
    with pytest.raises(StateError, match=r"--resume .*ckpt_000002.pt: .*state: .*digest.* pass --allow-new-order"):
        run(data, tmp_path / "run", resume="latest", **kw)
    done = run(data, tmp_path / "run", resume="latest", allow_new_order=True, **kw)
    assert len(done.losses) == STEPS - 2
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert [c["step"] for c in record["order_changes"]] == [2] and "digest" in record["order_changes"][0]["what"]


@pytest.mark.parametrize("kind", ["indexed", "windows", "mixture"])  # a sampler's, a stream's, a mixture's
def test_a_state_without_an_order_record_resumes_as_before(tmp_path, kind, request):
    data = request.getfixturevalue(KINDS[kind][0])
    kw = KINDS[kind][1]
    straight = run(data, tmp_path / "straight", **kw)
    run(data, tmp_path / "run", stop_at=2, **kw)
    rewrite_loader_state(tmp_path / "run" / "ckpt_000002.pt", no_order)
    second = run(data, tmp_path / "run", resume="latest", **kw)
    assert second.losses == straight.losses[2:]
    assert json.loads((tmp_path / "run" / "run.json").read_text())["order_changes"] == []


def test_a_cache_rebuilt_with_other_tokens_of_the_same_size(tmp_path):
    """The data's shuffle seed changed: the same shards and sizes, other tokens; the loader's state names its
    data by the shards' sha256."""
    cache = tmp_path / "data" / "web"
    write_pretrain_cache(cache, {"train": [tokens(3000, 1), tokens(2000, 2)], "val": [tokens(600, 3)]})
    run(cache, tmp_path / "run", stop_at=2)
    before = sorted(p.name for p in (tmp_path / "run").iterdir())
    shutil.rmtree(cache)
    write_pretrain_cache(cache, {"train": [tokens(3000, 11), tokens(2000, 12)], "val": [tokens(600, 3)]})
    with pytest.raises(StateError, match=r"--resume .*: its loader state belongs to other data: .*other token "
                                         r"content.*resume on the data the run trained on, or go on from the same "
                                         r"position in the new data's order with --allow-new-order"):
        run(cache, tmp_path / "run", resume="latest")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == before
    done = run(cache, tmp_path / "run", resume="latest", allow_new_order=True)
    assert len(done.losses) == STEPS - 2
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["order_changes"] == [{"step": 2, "what": "the same shards and token counts, other token content "
                                                           "(the shards' sha256 differ)"}]
    ckpt = torch.load(tmp_path / "run" / f"ckpt_{STEPS:06d}.pt", map_location="cpu", weights_only=True)
    assert ckpt["train_config"]["allow_new_order"] is True
