"""Document-masked attention: flex_attention's block mask and the explicit mask give the same outputs.

fp32 on CPU (flex_attention runs eagerly there, forward only), several document layouts, GQA."""

from __future__ import annotations

import pytest
import torch

from niels_gpt.errors import ConfigError
from niels_gpt.train.attention import Attention, resolve
from niels_gpt.train.model import GPT, GPTConfig


def docs_from_lengths(rows: list[list[int]]) -> torch.Tensor:
    """(B, T) document ids from each row's document lengths; ids are unique across rows."""
    out, next_id = [], 0
    for lengths in rows:
        row = []
        for n in lengths:
            row += [next_id] * n
            next_id += 1
        out.append(row)
    return torch.tensor(out)


LAYOUTS = {
    "one document per row": [[48], [48]],
    "varied documents": [[5, 17, 1, 25], [30, 18]],
    "documents of one token": [[1] * 8 + [40], [24, 1, 1, 22]],
    "packed with a padding tail": [[12, 20, 16], [40, 8]],
    "across flex blocks (T=200)": [[60, 90, 50], [130, 1, 69]],
}


@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (4, 1)], ids=["mha", "gqa2", "mqa"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_flex_block_mask_equals_the_explicit_mask(layout, heads):
    doc = docs_from_lengths(LAYOUTS[layout])
    B, T = doc.shape
    H, K = heads
    g = torch.Generator().manual_seed(len(layout) * 10 + K)
    q, k, v = (torch.randn(B, n, T, 8, generator=g) for n in (H, K, K))
    flex, mask = Attention(doc, "flex")(q, k, v), Attention(doc, "mask")(q, k, v)
    assert flex.shape == (B, H, T, 8) and flex.dtype == torch.float32
    torch.testing.assert_close(flex, mask, atol=1e-5, rtol=1e-5)
    # and each document's rows are its own causal attention: what the document would get alone
    r, start = 1, 0
    for n in LAYOUTS[layout][r]:
        alone = Attention(None)(q[r:r + 1, :, start:start + n], k[r:r + 1, :, start:start + n],
                                v[r:r + 1, :, start:start + n])
        torch.testing.assert_close(flex[r:r + 1, :, start:start + n], alone, atol=1e-5, rtol=1e-5)
        start += n


def test_the_model_gives_the_same_logits_through_flex_and_the_mask():
    model = GPT(GPTConfig(sequence_len=64, vocab_size=50, n_layer=2, n_head=4, n_kv_head=2, n_embd=32))
    model.init_weights(torch.Generator().manual_seed(0))
    with torch.no_grad():  # the training init zeroes the output projections: give every weight a value
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    ids = torch.randint(0, 50, (2, 64), generator=torch.Generator().manual_seed(1))
    cu = torch.tensor([0, 10, 40, 64, 64 + 33, 128], dtype=torch.int32)
    with torch.no_grad():
        model.attention = "flex"
        flex = model(ids, cu_seqlens=cu)
        model.attention = "mask"
        mask = model(ids, cu_seqlens=cu)
    torch.testing.assert_close(flex, mask, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(mask, model(ids).detach(), atol=1e-3)  # documents change the result


def test_the_kernel_follows_the_device_and_flex_refuses_a_cpu_backward():
    assert resolve("auto", torch.device("cpu")) == "mask"
    assert resolve("auto", torch.device("cuda")) == "flex"
    with pytest.raises(ConfigError, match="attention 'dense': expected one of auto, flex, mask"):
        resolve("dense", torch.device("cpu"))
    doc = docs_from_lengths([[3, 5]])
    q = torch.randn(1, 2, 8, 4, requires_grad=True)
    with pytest.raises(ConfigError, match="train on CPU with --attention mask"):
        Attention(doc, "flex")(q, q.detach(), q.detach())
