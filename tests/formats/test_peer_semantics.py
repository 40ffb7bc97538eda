"""Regression tests for the peers' exact semantics (issue 9, items 1, 4, 5, 6, 7)."""

from __future__ import annotations

import numpy as np

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
