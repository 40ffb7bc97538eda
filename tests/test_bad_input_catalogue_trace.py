"""Bad-input catalogue: `trace` (a directory that is not a run, a step or rank the run did not have, a document
the cache does not hold, a cache that moved or changed since the run, a checkpoint whose data order is not the
one its settings give).

Each case goes through check_case: exit status 1, one `error: ...` line with the case's key phrases, and the
inputs it read unchanged.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from niels_gpt.meta import write_meta
from niels_gpt.train.train import TrainConfig, train

from .test_bad_input_catalogue import Case, check_case, world  # noqa: F401
from .train.test_new_order import other_order, rewrite_loader_state

TINY = dict(depth=1, n_embd=32, n_head=2, sequence_len=16, device_batch_size=2, steps=2, eval_steps=1, log_every=0)


def _run(w, tmp: Path, *, own_cache: bool = False) -> tuple[Path, Path]:
    """(a 2-step run, the cache it trained on): on the world's cache, or on a copy of it in `tmp`."""
    cache = shutil.copytree(w.pretrain, tmp / "cache") if own_cache else w.pretrain
    run = tmp / "run"
    train(TrainConfig(data=str(cache), out_dir=str(run), **TINY), log=lambda *a: None)
    return run, cache


def not_a_run(w, tmp):
    return ["trace", str(w.pretrain), "--step", "1"]


def no_such_run(w, tmp):
    return ["trace", str(tmp / "runs" / "gone"), "--step", "1"]


def step_beyond_the_run(w, tmp):
    return ["trace", str(_run(w, tmp)[0]), "--step", "3"]


def rank_beyond_the_world(w, tmp):
    return ["trace", str(_run(w, tmp)[0]), "--step", "1", "--rank", "2"]


def document_not_in_the_cache(w, tmp):
    return ["trace", str(_run(w, tmp)[0]), "--document", "train:99999"]


def document_id_malformed(w, tmp):
    return ["trace", str(_run(w, tmp)[0]), "--document", "twelve"]


def cache_changed_since_the_run(w, tmp):
    run, cache = _run(w, tmp, own_cache=True)
    meta = json.loads((cache / "meta.json").read_text())
    rel = next(r for r in meta["files"] if r.startswith("train/"))
    tokens = np.fromfile(cache / rel, dtype="<u2")
    tokens[10:20] = tokens[10:20][::-1].copy()  # the same size, other tokens: a rebuild with other text
    tokens.tofile(cache / rel)
    meta["files"][rel]["sha256"] = hashlib.sha256((cache / rel).read_bytes()).hexdigest()
    write_meta(str(cache), meta)
    return ["trace", str(run), "--step", "1"]


def cache_moved_since_the_run(w, tmp):
    run, cache = _run(w, tmp, own_cache=True)
    cache.rename(tmp / "moved")
    return ["trace", str(run), "--step", "1"]


def order_not_the_replayed_one(w, tmp):
    run, _ = _run(w, tmp)
    rewrite_loader_state(run / "ckpt_000002.pt", other_order)
    return ["trace", str(run), "--step", "1"]


CASES = [
    Case("trace: a cache directory instead of a run", not_a_run, ("not a training run", "no run.json", "--out-dir"),
         reads=("pretrain",)),
    Case("trace: a run directory that does not exist", no_such_run, ("gone", "no such directory", "run directory")),
    Case("trace: a step beyond the run", step_beyond_the_run, ("--step 3", "beyond the run", "from 1 to 2")),
    Case("trace: a rank beyond the run's world size", rank_beyond_the_world,
         ("--rank 2", "ran on 1 rank", "from 0 to 0")),
    Case("trace: a document the cache does not hold", document_not_in_the_cache,
         ("train:99999", "holds documents train:0..", "give one of those")),
    Case("trace: a document id that is not SPLIT:INDEX", document_id_malformed,
         ("--document twelve", "expected split:index", "train:12")),
    Case("trace: the cache changed since the run", cache_changed_since_the_run,
         ("not the data the run", "fingerprint", "rebuilt or changed", "--data")),
    Case("trace: the cache moved since the run", cache_moved_since_the_run,
         ("cannot be opened as the run read it", "pass --data")),
    Case("trace: a checkpoint whose data order is not the replayed one", order_not_the_replayed_one,
         ("ckpt_000002.pt", "data order", "digest 000000000000", "release that trained it")),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_trace_bad_input_gets_one_line(case, world, tmp_path, capsys):  # noqa: F811
    check_case(case, world, tmp_path, capsys)
