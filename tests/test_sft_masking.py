"""Contract acceptance test 1: SFT loss masking, plus the span rule's edge cases."""

import numpy as np
import pytest
import torch

from niels_gpt.cache.sft_dataset import IGNORE_INDEX, SFTExampleDataset, assistant_span_mask
from niels_gpt.errors import ConfigError

from .conftest import SPECIALS, write_sft_cache

SYS, USR, ASST, EOT = SPECIALS["sys"], SPECIALS["usr"], SPECIALS["asst"], SPECIALS["eot"]
A, B = 101, 102


def _dataset(tmp_path, examples, T):
    write_sft_cache(tmp_path / "sft", examples)
    d = tmp_path / "sft"
    return SFTExampleDataset(str(d / "train_tokens.bin"), str(d / "train_idx.npy"), T=T, device="cpu", eot_id=EOT)


def test_only_assistant_targets_and_their_eot_are_trained(tmp_path):
    # <sys> s1 s2 <eot> <usr> u1 <eot> <asst> A B <eot>
    seq = [SYS, 11, 12, EOT, USR, 21, EOT, ASST, A, B, EOT]
    ds = _dataset(tmp_path, [seq], T=len(seq) - 1)
    x, y, y_masked = ds.get_batch(B=3, generator=torch.Generator().manual_seed(0))
    assert x.dtype == y.dtype == y_masked.dtype == torch.int64
    assert x[0].tolist() == seq[:-1]
    assert y[0].tolist() == seq[1:]
    trained = [(t, int(v)) for t, v in enumerate(y_masked[0]) if v != IGNORE_INDEX]
    assert [v for _, v in trained] == [A, B, EOT]
    assert [t for t, _ in trained] == [7, 8, 9]  # targets y[7]=A, y[8]=B, y[9]=EOT
    assert (y_masked[0][:7] == IGNORE_INDEX).all()


def test_padding_is_eot_and_never_a_target(tmp_path):
    seq = [USR, 21, EOT, ASST, A, EOT]
    ds = _dataset(tmp_path, [seq], T=10)
    x, y, y_masked = ds.get_batch(B=1, generator=torch.Generator().manual_seed(0))
    # T + 1 = 11: six real tokens, five EOTs of padding.
    assert x[0].tolist() == seq + [EOT] * 4
    assert y[0].tolist() == seq[1:] + [EOT] * 5
    assert y_masked[0].tolist() == [-100, -100, -100, A, EOT] + [-100] * 5


def test_truncation_keeps_first_T_plus_1_tokens(tmp_path):
    seq = [USR, 21, EOT, ASST] + list(range(100, 120)) + [EOT]
    ds = _dataset(tmp_path, [seq], T=8)
    x, y, y_masked = ds.get_batch(B=1, generator=torch.Generator().manual_seed(0))
    assert x[0].tolist() == seq[:8]
    assert y[0].tolist() == seq[1:9]
    assert y_masked[0].tolist() == [-100, -100, -100] + seq[4:9]


def test_several_assistant_turns_each_trained(tmp_path):
    seq = [USR, 21, EOT, ASST, A, EOT, USR, 22, EOT, ASST, B, B, EOT]
    mask = assistant_span_mask(np.array(seq), ASST, EOT)
    assert mask.tolist() == [0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1, 1]


def test_span_mask_matches_render_chat_mask(tokenizer, special_tokens):
    conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi " + special_tokens["asst"]},
            {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "Again"},
            {"role": "assistant", "content": "Hi again."}]
    ids, mask = tokenizer.render_chat(conv)
    span = assistant_span_mask(np.array(ids), tokenizer.asst_id, tokenizer.eot_id)
    assert span.tolist() == mask


def test_rejects_wrong_eot_id(tmp_path):
    write_sft_cache(tmp_path / "sft", [[USR, 1, EOT, ASST, 2, EOT]])
    d = tmp_path / "sft"
    with pytest.raises(ConfigError, match="eot_id=9 but .*eot=6"):
        SFTExampleDataset(str(d / "train_tokens.bin"), str(d / "train_idx.npy"), T=4, device="cpu", eot_id=9)
