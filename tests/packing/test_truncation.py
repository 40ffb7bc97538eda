"""pack-sft says what a pack size cuts: the share of tokens and of trained targets lost to truncation, a
warning above 1%, and the pack size that keeps 99% of both."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from niels_gpt.cache.cli import main
from niels_gpt.packing.pack import pack_sft

from ..conftest import write_sft_cache

# the library's sentinels in conftest: usr 4, asst 5, eot 6. Trained: assistant content and its EOT.
LONG = [4, 10, 5, *range(20, 27), 6]  # 11 tokens, trained at positions 3..10
SHORT = [4, 11, 5, 30, 6]  # 5 tokens, trained at 3..4


def test_the_share_of_tokens_and_trained_targets_cut_is_reported_and_warned(tmp_path, capsys):
    sft = write_sft_cache(tmp_path / "sft", [LONG, SHORT] * 3)
    with pytest.warns(UserWarning, match=r"--seq-len 8 truncates examples and drops 18.8% of the tokens \(9 of 48\) "
                                         r"and 30.0% of the trained targets \(9 of 30\); --seq-len 64 keeps 99%"):
        m = pack_sft(sft, tmp_path / "p", pack_size=8)
    assert m["truncation"] == {"tokens": 48, "tokens_lost": 9, "trained_targets": 30, "trained_targets_lost": 9,
                               "pack_size_keeping_99pct": 64}
    assert json.loads((tmp_path / "p" / "manifest.json").read_text())["truncation"] == m["truncation"]
    assert main(["pack-sft", str(sft), str(tmp_path / "q"), "--seq-len", "8"]) == 0
    out, err = capsys.readouterr()
    assert "truncated 3, 18.8% of the tokens and 30.0% of the trained targets cut" in out
    assert err.strip().splitlines()[-1].startswith("pack-sft: warning: ") and "--seq-len 64 keeps 99%" in err


def test_nothing_cut_means_no_warning(tmp_path, capsys):
    sft = write_sft_cache(tmp_path / "sft", [LONG, SHORT])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = pack_sft(sft, tmp_path / "p", pack_size=16)
    assert m["truncation"]["tokens_lost"] == 0 and m["truncated"] == 0
    assert main(["pack-sft", str(sft), str(tmp_path / "q"), "--pack-size", "16"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_the_suggested_size_keeps_99_percent(tmp_path):
    rng = np.random.default_rng(0)
    examples = [[4, 9, 5, *rng.integers(10, 1000, int(n)).tolist(), 6] for n in rng.integers(5, 300, 200)]
    sft = write_sft_cache(tmp_path / "sft", examples)
    with pytest.warns(UserWarning):
        size = pack_sft(sft, tmp_path / "p", pack_size=64)["truncation"]["pack_size_keeping_99pct"]
    lengths = np.array([len(e) for e in examples])
    assert size % 64 == 0 and np.minimum(lengths, size).sum() >= 0.99 * lengths.sum()
    assert np.minimum(lengths, size - 64).sum() < 0.99 * lengths.sum()  # and no smaller multiple of 64 does
