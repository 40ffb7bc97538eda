"""A reader, read_meta and `verify` opened on an output whose first build was interrupted say so, name what the
build left and the command that finishes it (niels_gpt.meta.unfinished_build, the one rule all three share)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from niels_gpt.errors import CacheError
from niels_gpt.readers.pretrain import PretrainTokenStreamDataset
from niels_gpt.readers.sft import SFTExampleDataset
from niels_gpt.report import verify_outputs


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _interrupted(root, kind: str, name: str, pid: int):
    """What build_aside leaves when its build is killed before the swap: a staging directory and a lock."""
    stage = root / kind / f"{name}.tmp-{pid}"
    (stage / "train").mkdir(parents=True)
    (root / kind / f"{name}.lock").write_text(f'{{"pid": {pid}, "host": "here", "since": "then"}}')
    return stage


def test_a_reader_on_an_interrupted_build_all_says_how_to_finish_it(tmp_path):
    pid = _dead_pid()
    _interrupted(tmp_path, "pretrain", "wikitext", pid)
    _interrupted(tmp_path, "sft", "dolly15k", pid)
    finish = rf"its build was interrupted before it finished \(it left wikitext.tmp-{pid} beside it, and no " \
             rf"meta.json\): finish it by running `build-all --cache-dir {tmp_path} --only wikitext`"
    with pytest.raises(CacheError, match=finish):
        PretrainTokenStreamDataset(str(tmp_path / "pretrain" / "wikitext" / "train"), T=8, device="cpu")
    sft = tmp_path / "sft" / "dolly15k"
    with pytest.raises(CacheError, match=r"dolly15k: its build was interrupted.*--only dolly15k`"):
        SFTExampleDataset(str(sft / "train_tokens.bin"), str(sft / "train_idx.npy"), T=8, device="cpu", eot_id=3)
    problems, _, _ = verify_outputs(str(tmp_path))
    assert len(problems) == 2 and all("its build was interrupted" in p for p in problems), problems
    problems, _, _ = verify_outputs(str(tmp_path / "pretrain" / "wikitext"))
    assert len(problems) == 1 and "--only wikitext" in problems[0]


def test_a_build_still_running_is_named_as_such(tmp_path):
    _interrupted(tmp_path, "pretrain", "fineweb_edu", os.getpid())  # a live pid: the build is under way
    with pytest.raises(CacheError, match=r"fineweb_edu: a build of it is still running \(fineweb_edu.tmp-\d+ beside "
                                         r"it has no meta.json yet\): wait for it to finish"):
        PretrainTokenStreamDataset(str(tmp_path / "pretrain" / "fineweb_edu" / "train"), T=8, device="cpu")


def test_a_missing_cache_with_nothing_beside_it_is_still_just_missing(tmp_path):
    (tmp_path / "pretrain").mkdir()
    with pytest.raises(CacheError, match=r"wikitext/train: no such shard directory"):
        PretrainTokenStreamDataset(str(tmp_path / "pretrain" / "wikitext" / "train"), T=8, device="cpu")
