"""One door (niels_gpt.locate): what a path holds, and one clear line for everything that is not an output."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from niels_gpt.cache.build_cache import build_pretrain_cache, build_sft_cache
from niels_gpt.cache.cli import main
from niels_gpt.errors import FormatError, IncompleteCacheError
from niels_gpt.locate import locate

from .conftest import sample_texts


@pytest.fixture(scope="module")
def root(tmp_path_factory, tokenizer) -> Path:
    r = tmp_path_factory.mktemp("locate") / "cache"
    build_pretrain_cache([t for t in sample_texts()[:6] if t.strip()], str(r / "pretrain" / "docs"), tokenizer=tokenizer,
                         max_train_tokens=4000, max_val_tokens=500, shard_bytes=4096, seed=0, shuffle_buffer=None)
    build_sft_cache([[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]] * 4,
                    str(r / "sft" / "chat"), tokenizer=tokenizer, val_frac=0.0, seed=0)
    shutil.copytree(Path(tokenizer.model_path).parent, r / "tokenizer")
    return r


def test_each_kind_of_output_is_named(root, tmp_path):
    assert (locate(root / "pretrain" / "docs").kind, locate(root / "pretrain" / "docs").split) == ("pretrain", None)
    val = locate(root / "pretrain" / "docs" / "val")
    assert (val.kind, val.root, val.split) == ("pretrain", root / "pretrain" / "docs", "val")
    assert locate(root / "sft" / "chat").kind == "sft"
    assert locate(root / "tokenizer").kind == "tokenizer"
    assert locate(root).kind == "root"
    (tmp_path / "mix.toml").write_text("[datasets]\n")
    assert locate(tmp_path / "mix.toml").kind == "mixture"


@pytest.mark.parametrize("make, error, phrase", [
    (lambda d: d / "nowhere", FormatError, "no such file or directory"),
    (lambda d: (d / "docs.jsonl").write_text('{"text": "a"}\n') and d / "docs.jsonl", FormatError,
     "a text file, not a token cache: build one from it first"),
    (lambda d: (d / "empty").mkdir() or d / "empty", FormatError, "an empty directory"),
    (lambda d: ((d / "out.tmp-999999999").mkdir(), d / "out")[1], IncompleteCacheError,
     "its build was interrupted before it finished"),
    (lambda d: ((d / "meta.json").write_text("{broken"), d)[1], FormatError, "not readable JSON"),
])
def test_everything_else_is_one_clear_error(tmp_path, make, error, phrase):
    with pytest.raises(error, match=phrase):
        locate(make(tmp_path))


@pytest.mark.parametrize("command", ["stats", "inspect"])
def test_stats_and_inspect_say_the_same_through_the_one_door(tmp_path, capsys, command):
    (tmp_path / "out.tmp-999999999").mkdir()
    (tmp_path / "docs.jsonl").write_text(json.dumps({"text": "a"}) + "\n")
    for path, phrase in ((tmp_path / "out", "build was interrupted"), (tmp_path / "docs.jsonl", "a text file")):
        capsys.readouterr()
        assert main([command, str(path)]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("error: ") and phrase in err[-1], err
