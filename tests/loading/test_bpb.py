"""Bits per byte equals a hand computation; specials and -100 targets do not count."""

import math

import pytest
import torch

from niels_gpt.errors import ConfigError
from niels_gpt.loading import evaluate_bpb, token_bytes


def test_bpb_of_a_tiny_model_equals_a_hand_computation(tokenizer):
    tb = token_bytes(tokenizer)
    V = len(tb)
    eot, bos = tokenizer.eot_id, tokenizer.bos_id
    assert tb[eot] == 0 and tb[bos] == 0
    ids = tokenizer.encode("The king is dead, long live the queen; and all the realm rejoiced at last.")
    assert len(ids) >= 12
    torch.manual_seed(0)
    model = torch.nn.Embedding(V, V)
    x = torch.tensor([[bos] + ids[:5], ids[5:11]])
    y = torch.tensor([ids[:5] + [eot], ids[6:11] + [-100]])
    got = evaluate_bpb(model, [(x, y)], tb)
    nats, nbytes = 0.0, 0
    W = model.weight.detach().double()
    for xi, yi in zip(x.flatten().tolist(), y.flatten().tolist(), strict=True):
        if yi < 0 or tb[yi] == 0:
            continue
        row = W[xi].tolist()
        lse = math.log(sum(math.exp(v) for v in row))
        nats += lse - row[yi]
        nbytes += int(tb[yi])
    assert nbytes == sum(len(tokenizer.decode([t]).encode()) for t in ids[:5] + ids[6:11])
    assert got == pytest.approx(nats / (math.log(2) * nbytes), rel=1e-6)


def test_steps_limits_an_endless_batch_source():
    tb = torch.tensor([1, 2])
    model = torch.nn.Embedding(2, 2)
    torch.nn.init.zeros_(model.weight)  # uniform prediction: ln 2 nats per target

    def endless():
        while True:
            yield torch.tensor([[0, 1]]), torch.tensor([[1, 0]])

    assert evaluate_bpb(model, endless(), tb, steps=3) == pytest.approx(2 / 3)


def test_all_targets_ignored_is_rejected():
    with pytest.raises(ConfigError, match="no target byte to score"):
        evaluate_bpb(torch.nn.Embedding(2, 2), [(torch.tensor([[0]]), torch.tensor([[-100]]))], torch.tensor([1, 1]))


def test_target_outside_token_bytes_is_rejected():
    with pytest.raises(ConfigError, match="target id 5 >= vocabulary 2"):
        evaluate_bpb(torch.nn.Embedding(6, 6), [(torch.tensor([[0]]), torch.tensor([[5]]))], torch.tensor([1, 1]))


def test_an_infinite_loss_at_an_uncounted_target_leaves_bpb_finite():
    """A model that never predicts a special token (its logit -inf) has an infinite loss where the target is that
    token or ignored (-100 reads as id 0): those targets do not count, and the figure stays the counted ones'."""
    tb = torch.tensor([0, 1, 1, 1])  # id 0 is a special token: 0 bytes

    def model(x):
        logits = torch.zeros(*x.shape, 4)
        logits[..., 0] = float("-inf")
        return logits

    x, y = torch.tensor([[1, 2, 3, 1]]), torch.tensor([[2, -100, 0, 3]])
    assert evaluate_bpb(model, [(x, y)], tb) == pytest.approx(math.log(3) / math.log(2))
