"""Trained-token masks and the within-sequence shift: exact values, agreement with the SFT dataset,
and the boundary leak of the design document's single roll."""

import numpy as np
import torch

from niels_gpt.cache.sft_dataset import assistant_span_mask
from niels_gpt.packing.memmap_format import shift_within_sequences
from niels_gpt.spans import assistant_token_mask

from .helpers import ASST, EOT, SYS, USR, chat, plan_roll


def test_assistant_span_worked_example():
    tokens = [SYS, 11, EOT, USR, 21, 22, EOT, ASST, 31, 32, EOT]
    m = assistant_token_mask(tokens, ASST, EOT)
    assert m.astype(int).tolist() == [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1]


def test_agrees_with_the_sft_dataset_rule_on_random_streams():
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        # a small alphabet makes sentinels and EOTs frequent and adjacent
        seq = torch.randint(3, 9, (int(torch.randint(1, 60, (1,), generator=g)),), generator=g).numpy()
        assert np.array_equal(assistant_token_mask(seq, ASST, EOT), assistant_span_mask(seq, ASST, EOT))


def test_span_state_resets_at_each_sequence_start():
    cut = [USR, 15, EOT, ASST, 40, 41]  # an assistant turn truncated before its EOT
    nxt = [USR, 50, 51, EOT, ASST, 60, EOT]
    tokens = np.array(cut + nxt)
    m = assistant_token_mask(tokens, ASST, EOT, seq_starts=[0, len(cut)])
    assert m.astype(int).tolist() == [0, 0, 0, 0, 1, 1] + [0, 0, 0, 0, 0, 1, 1]
    # without the reset the open span would swallow the next user turn
    assert assistant_token_mask(tokens, ASST, EOT)[len(cut):len(cut) + 4].all()


def test_shift_within_sequences_worked_example():
    a = chat(0, 2, 2)  # [usr] u u [eot] [asst] y y [eot]
    b = chat(1, 1, 1)  # [usr] u [eot] [asst] y [eot]
    tokens = np.array(a + b)
    m = assistant_token_mask(tokens, ASST, EOT, seq_starts=[0, 8])
    assert m.astype(int).tolist() == [0, 0, 0, 0, 0, 1, 1, 1] + [0, 0, 0, 0, 1, 1]
    loss = shift_within_sequences(m, [0, 8])
    assert loss.tolist() == [0, 0, 0, 0, 1, 1, 1, 0] + [0, 0, 0, 1, 1, 0]


def test_single_roll_of_the_design_leaks_across_the_boundary_and_ours_does_not():
    a, b = chat(0, 2, 2), chat(1, 1, 1)
    tokens = np.array(a + b)
    start = len(a)
    m = assistant_token_mask(tokens, ASST, EOT, seq_starts=[0, start])
    rolled = plan_roll(m, len(tokens))
    # The roll marks position `start` (the first token of sequence 2) as a target predicted from the
    # last token of sequence 1: a target across the boundary.
    assert m[start - 1] and rolled[start] == 1
    ours = shift_within_sequences(m, [0, start])
    # Ours: loss_mask[j] covers input_ids[j+1]; at the last position of each sequence it is 0.
    assert ours[start - 1] == 0 and ours[len(tokens) - 1] == 0
    # and inside each sequence it is exactly the trained mask of the next token
    assert ours[:start - 1].tolist() == m[1:start].astype(int).tolist()
    assert ours[start:-1].tolist() == m[start + 1:].astype(int).tolist()


def test_shift_leaves_padding_zero():
    m = np.array([0, 1, 1, 1, 0, 0], dtype=bool)
    out = np.full(6, 7, dtype=np.uint8)
    shift_within_sequences(m, [0], length=4, out=out)
    assert out.tolist() == [1, 1, 1, 0, 0, 0]


def test_pack_sft_trains_the_stored_mask_wherever_the_sft_reader_does(tmp_path):
    """A cache with a stored mask ({split}_mask.bin) and an assistant sentinel id (a tokenizer with some of the
    library's chat tokens but not all): the SFT reader trains the stored mask, pack-sft trained the span rule
    instead, so the same cache trained other tokens packed. Both train the stored mask now."""
    import json

    from niels_gpt.cache.sft_dataset import SFTExampleDataset
    from niels_gpt.meta import file_record, write_meta
    from niels_gpt.packing import open_packed, pack_sft

    from ..conftest import write_sft_cache

    examples = [chat(i, 3 + i, 4 + i) for i in range(6)]
    cache = write_sft_cache(tmp_path / "c", examples)
    meta = json.loads((cache / "meta.json").read_text())
    n = sum(map(len, examples))
    stored = np.random.default_rng(1).integers(0, 2, n).astype(np.uint8)  # unlike the span rule
    stored.tofile(cache / "train_mask.bin")
    meta["files"]["train_mask.bin"] = file_record(cache / "train_mask.bin", None)
    meta["special_token_ids"]["sys"] = None
    write_meta(str(cache), meta)
    pack_sft(cache, tmp_path / "p", pack_size=64, warn=False)
    packed = open_packed(tmp_path / "p")
    ds = SFTExampleDataset(str(cache / "train_tokens.bin"), str(cache / "train_idx.npy"), T=63, device="cpu",
                           eot_id=EOT)
    examples_of = np.load(tmp_path / "p" / "examples.npy")
    got, want, k = 0, 0, 0
    for b in range(len(packed)):
        item = packed[b]
        for s, e in zip(item["seq_boundaries"][:-1], item["seq_boundaries"][1:], strict=True):
            ex = int(examples_of[k])
            k += 1
            assert item["loss_mask"][s:e - 1].tolist() == ds.trained(ex)[1:].astype(int).tolist()
            got, want = got + int(item["loss_mask"][s:e].sum()), want + int(ds.trained(ex)[1:].sum())
    assert got == want and k == len(examples)
