"""Regression tests for the peers' exact semantics (issue 9, items 1, 4, 5, 6, 7)."""

from __future__ import annotations

import numpy as np
import pytest

from niels_gpt.cache.cli import main
from niels_gpt.errors import ConfigError
from niels_gpt.formats.convert import convert
from niels_gpt.formats.nanogpt_dataset import NanogptDataset


def _windows(ds) -> list[list[int]]:
    return [s["input_ids"].tolist() + s["labels"][-1:].tolist() for s in ds]


def test_nanogpt_windows_advance_seq_len_plus_one_like_automodel(tmp_path):
    # NeMo AutoModel: pos = 0; while pos + T < n: yield tokens[pos:pos + T + 1]; pos += T + 1
    np.save(tmp_path / "a.npy", np.arange(10, 32, dtype="<u2"))  # 22 tokens
    got = _windows(NanogptDataset([str(tmp_path / "a.npy")], 4))
    assert got == [[10, 11, 12, 13, 14], [15, 16, 17, 18, 19], [20, 21, 22, 23, 24], [25, 26, 27, 28, 29]]


def test_nanogpt_bos_aligned_windows_look_for_the_next_bos_after_the_window_like_automodel(tmp_path):
    B = 1
    #          0  1  2  3  4  5  6  7  8  9 10 11
    tokens = [B, 2, 3, B, 4, 5, 6, B, 7, B, 8, 9]
    np.save(tmp_path / "a.npy", np.asarray(tokens, dtype="<u2"))
    got = _windows(NanogptDataset([str(tmp_path / "a.npy")], 3, bos_token=B, align_to_bos=True))
    # window [0, 4); the next starts at the first BOS at or after 4 (index 7); [7, 11); none after 11
    assert got == [[B, 2, 3, B], [B, 7, B, 8]]


@pytest.mark.parametrize("dst", ["s3://bucket/x", "gs://b/y", "file:///tmp/z", "memory://m"])
def test_convert_refuses_a_url_destination_and_writes_nothing_local(small_cache, tmp_path, monkeypatch, dst, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"a URL as the destination; .*remote output is not supported by convert"):
        convert(small_cache, dst, to="raw")
    assert main(["convert", str(small_cache), dst, "--to", "kempner-npy"]) == 1
    err = capsys.readouterr().err
    assert dst in err and "remote output is not supported by convert" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]  # no ./s3:/ directory


def test_convert_refuses_a_url_source(tmp_path):
    with pytest.raises(ConfigError, match="s3://bucket/src: a URL as the source"):
        convert("s3://bucket/src", tmp_path / "out", to="raw")
    assert not (tmp_path / "out").exists()


def test_is_url_is_a_scheme_not_a_drive():
    from niels_gpt.urls import is_url

    assert is_url("s3://b/k") and is_url("https://h/x") and is_url("file:///tmp/x")
    assert not is_url("C:\\\\data") and not is_url("C://data") and not is_url("out/s3:/x")
