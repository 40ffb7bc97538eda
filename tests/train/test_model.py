"""The GPT's forward against a by-hand computation on tiny configs: shapes, causality, documents, GQA."""

from __future__ import annotations

import math

import pytest
import torch

from niels_gpt.errors import ConfigError
from niels_gpt.train.model import GPT, GPTConfig
from niels_gpt.train.optim import Muon, lr_multiplier, muon_momentum, zeropower_via_newtonschulz5

V = 37


def tiny(n_head=4, n_kv_head=4, n_layer=2, n_embd=16, seed=0) -> GPT:
    model = GPT(GPTConfig(sequence_len=8, vocab_size=V, n_layer=n_layer, n_head=n_head, n_kv_head=n_kv_head,
                          n_embd=n_embd))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():  # nothing zero, unlike the training init
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return model


def rms(v):
    return v / torch.sqrt((v * v).mean(-1, keepdim=True) + torch.finfo(v.dtype).eps)


def by_hand(model: GPT, ids: list[int], docs: list[int] | None = None) -> torch.Tensor:
    """Logits for one row, one scalar at a time where it matters: explicit positions, masks and heads."""
    c = model.config
    T, H, K, hd = len(ids), c.n_head, c.n_kv_head, c.n_embd // c.n_head
    docs = docs or [0] * T
    pos = [t - min(s for s in range(T) if docs[s] == docs[t]) for t in range(T)]
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    x = rms(sd["transformer.wte.weight"][ids])

    def rotate(vec, p):  # vec (hd,): pairs (i, i + hd/2) by angle p * 10000^(-2i/hd)
        out = vec.clone()
        for i in range(hd // 2):
            a = p * 10000.0 ** (-2 * i / hd)
            x1, x2 = vec[i], vec[i + hd // 2]
            out[i] = x1 * math.cos(a) + x2 * math.sin(a)
            out[i + hd // 2] = -x1 * math.sin(a) + x2 * math.cos(a)
        return out

    for layer in range(c.n_layer):
        w = {n: sd[f"transformer.h.{layer}.{n}.weight"] for n in
             ("attn.c_q", "attn.c_k", "attn.c_v", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")}
        h = rms(x)
        q = (h @ w["attn.c_q"].T).view(T, H, hd)
        k = (h @ w["attn.c_k"].T).view(T, K, hd)
        v = (h @ w["attn.c_v"].T).view(T, K, hd)
        y = torch.zeros(T, H, hd)
        for head in range(H):
            kv = head // (H // K)  # consecutive query heads share a kv head
            for t in range(T):
                qt = rms(rotate(q[t, head], pos[t]))
                allowed = [s for s in range(t + 1) if docs[s] == docs[t]]
                scores = torch.stack([qt @ rms(rotate(k[s, kv], pos[s])) / math.sqrt(hd) for s in allowed])
                att = torch.softmax(scores, 0)
                y[t, head] = sum(a * v[s, kv] for a, s in zip(att, allowed, strict=True))
        x = x + y.reshape(T, -1) @ w["attn.c_proj"].T
        x = x + torch.relu(rms(x) @ w["mlp.c_fc"].T).square() @ w["mlp.c_proj"].T
    logits = rms(x) @ sd["lm_head.weight"].T
    return 15 * torch.tanh(logits / 15)


IDS = [3, 17, 5, 29, 11, 2, 36, 8]


@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (4, 1)])
def test_forward_matches_the_hand_computation(heads):
    model = tiny(*heads)
    logits = model(torch.tensor([IDS]))
    assert logits.shape == (1, 8, V) and logits.dtype == torch.float32
    torch.testing.assert_close(logits[0], by_hand(model, IDS), atol=2e-5, rtol=1e-5)


def test_documents_match_the_hand_computation_and_each_document_alone():
    model = tiny(4, 2)
    docs = [0, 0, 0, 1, 1, 1, 1, 1]
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    got = model(torch.tensor([IDS]), cu_seqlens=cu)[0]
    torch.testing.assert_close(got, by_hand(model, IDS, docs), atol=2e-5, rtol=1e-5)
    # the second document scores exactly as it would alone: no attention back, RoPE restarts at 0
    torch.testing.assert_close(got[3:], model(torch.tensor([IDS[3:]]))[0], atol=1e-5, rtol=1e-5)  # float32 rounding differs by kernel path
    torch.testing.assert_close(got[:3], model(torch.tensor([IDS[:3]]))[0], atol=1e-5, rtol=1e-5)  # float32 rounding differs by kernel path


def test_cu_seqlens_position_ids_and_doc_ids_describe_the_same_layout():
    model = tiny(4, 2)
    x = torch.tensor([IDS, IDS[::-1]])
    # row 0: docs of 3 and 5; row 1: 5 and 3 (cu_seqlens runs over the flattened 2*8 tokens)
    cu = torch.tensor([0, 3, 8, 13, 16], dtype=torch.int32)
    pos = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 0, 1, 2]])
    doc = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1], [4, 4, 4, 4, 4, 9, 9, 9]])
    a = model(x, cu_seqlens=cu)
    torch.testing.assert_close(a, model(x, position_ids=pos))
    torch.testing.assert_close(a, model(x, doc_ids=doc))
    torch.testing.assert_close(a[1, 5:], model(torch.tensor([IDS[::-1][5:]]))[0], atol=1e-5, rtol=1e-5)  # float32 rounding differs by kernel path


def test_attention_is_causal_and_never_crosses_a_document():
    model = tiny(4, 2)
    x = torch.tensor([IDS])
    changed = x.clone()
    changed[0, 5] = 1
    assert torch.equal(model(x)[0, :5], model(changed)[0, :5])
    assert not torch.equal(model(x)[0, 5:], model(changed)[0, 5:])
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    changed = x.clone()
    changed[0, :3] = torch.tensor([1, 1, 1])  # rewrite document 0 only
    assert torch.equal(model(x, cu_seqlens=cu)[0, 3:], model(changed, cu_seqlens=cu)[0, 3:])


def test_gqa_equals_mha_with_each_kv_head_repeated_for_its_query_heads():
    gqa = tiny(4, 2, n_layer=1)
    mha = tiny(4, 4, n_layer=1)
    sd = gqa.state_dict()
    hd = 4
    for name in ("c_k", "c_v"):
        w = sd[f"transformer.h.0.attn.{name}.weight"].view(2, hd, 16)
        sd[f"transformer.h.0.attn.{name}.weight"] = w.repeat_interleave(2, dim=0).reshape(16, 16)
    mha.load_state_dict(sd)
    x = torch.tensor([IDS])
    torch.testing.assert_close(gqa(x), mha(x), atol=1e-5, rtol=1e-5)  # float32 rounding differs by kernel path
    same = tiny(4, 4, n_layer=1, seed=3)
    torch.testing.assert_close(same(x)[0], by_hand(same, IDS), atol=2e-5, rtol=1e-5)


def test_loss_is_the_mean_over_counted_targets():
    model = tiny()
    x = torch.tensor([IDS])
    y = torch.tensor([IDS[1:] + [4]])
    y[0, :3] = -100
    logits = model(x)
    want = torch.nn.functional.cross_entropy(logits[0, 3:], y[0, 3:])
    torch.testing.assert_close(model(x, y), want)
    assert model(x, torch.full_like(y, -100)).item() == 0.0  # nothing to learn: 0, not NaN


def test_training_init_zeroes_head_and_residual_projections():
    model = tiny()
    model.init_weights(torch.Generator().manual_seed(0))
    assert not model.lm_head.weight.any() and not model.transformer.h[0].mlp.c_proj.weight.any()
    logits = model(torch.tensor([IDS]))
    assert torch.equal(logits, torch.zeros_like(logits))  # uniform: the loss starts at ln(V)
    assert model.transformer.wte.weight.std().item() == pytest.approx(1.0, abs=0.2)


def test_config_from_depth_follows_nanochat_sizing():
    d20 = GPTConfig.from_depth(20, vocab_size=65536, sequence_len=2048)
    assert (d20.n_embd, d20.n_head, d20.n_kv_head, d20.n_layer) == (1280, 10, 10, 20)
    d2 = GPTConfig.from_depth(2, vocab_size=100, sequence_len=64)
    assert (d2.n_embd, d2.n_head) == (128, 1)
    d5 = GPTConfig.from_depth(5, vocab_size=100, sequence_len=64)
    assert d5.n_embd % d5.n_head == 0 and (d5.n_embd // d5.n_head) % 2 == 0


@pytest.mark.parametrize("kw,match", [
    ({"n_embd": 18, "n_head": 4, "n_kv_head": 4}, "not a multiple of n_head"),
    ({"n_embd": 12, "n_head": 4, "n_kv_head": 4}, "must be even"),
    ({"n_embd": 16, "n_head": 4, "n_kv_head": 3}, "must divide n_head"),
    ({"n_embd": 16, "n_head": 4, "n_kv_head": 4, "vocab_size": 0}, "vocab_size=0"),
])
def test_config_rejects_shapes_that_cannot_work(kw, match):
    with pytest.raises(ConfigError, match=match):
        GPTConfig(**{"sequence_len": 8, "vocab_size": V, "n_layer": 1, **kw})


def test_bad_cu_seqlens_is_refused():
    with pytest.raises(ConfigError, match="cu_seqlens must"):
        tiny()(torch.tensor([IDS]), cu_seqlens=torch.tensor([0, 3, 7], dtype=torch.int32))


def test_schedules_and_muon():
    assert [lr_multiplier(s, 100) for s in (0, 80, 90, 99)] == [1.0, 1.0, 0.5, pytest.approx(0.05)]
    assert lr_multiplier(0, 100, warmup_ratio=0.1) == pytest.approx(0.1)
    assert (muon_momentum(0), muon_momentum(300), muon_momentum(1000)) == (0.85, 0.95, 0.95)
    g = torch.randn(16, 48, generator=torch.Generator().manual_seed(0))
    s = torch.linalg.svdvals(zeropower_via_newtonschulz5(g))
    assert 0.5 < s.min() and s.max() < 1.3  # every direction roughly unit: orthogonalised
    with pytest.raises(ConfigError, match="Muon takes matrices"):
        Muon([torch.nn.Parameter(torch.zeros(3))])
