"""pack-sft on an SFT cache rendered with a chat template: the loss mask comes from the stored
`{split}_mask.bin`, cut and shifted exactly like the tokens."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from niels_gpt.cache.build_cache import build_sft_cache
from niels_gpt.cache.cli import main
from niels_gpt.errors import NielsGPTError
from niels_gpt.packing import open_packed
from niels_gpt.packing.pack import pack_sft
from niels_gpt.tokenizer import load_tokenizer

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

CONVS = [[{"role": "user", "content": f"Question {i}: what is {i} plus {i}?"},
          {"role": "assistant", "content": f"{i} plus {i} is {2 * i}." + " Indeed." * (i % 4)}]
         for i in range(30)]


def _trained_targets(cache, split="train") -> Counter:
    """The tokens a model is trained to predict: each example's stored-mask tokens after its first position."""
    tokens = np.fromfile(cache / f"{split}_tokens.bin", dtype=np.uint16)
    mask = np.fromfile(cache / f"{split}_mask.bin", dtype=np.uint8).astype(bool)
    starts = np.load(cache / f"{split}_idx.npy")
    ends = np.append(starts[1:], len(tokens))
    out = Counter()
    for a, b in zip(starts, ends, strict=True):
        out.update(tokens[a + 1:b][mask[a + 1:b]].tolist())
    return out


@pytest.mark.parametrize("algorithm", ["bfd", "ffd"])
def test_a_template_rendered_cache_packs_with_its_stored_mask(tmp_path, hf_dir, algorithm, capsys):
    tok = load_tokenizer(hf_dir)
    cache = tmp_path / "sft"
    build_sft_cache(CONVS, str(cache), tokenizer=tok, val_frac=0.0, seed=0)
    manifest = pack_sft(cache, tmp_path / "packed", pack_size=128, algorithm=algorithm)
    assert manifest["source"]["mask_file"] == "train_mask.bin"
    ds = open_packed(tmp_path / "packed")
    got, sequences = Counter(), 0
    for i in range(len(ds)):
        item = ds[i]
        ids, loss = item["input_ids"], item["loss_mask"].astype(bool)
        for a, b in zip(item["seq_boundaries"][:-1], item["seq_boundaries"][1:], strict=True):
            sequences += 1
            assert not loss[b - 1]  # the last position of a sequence predicts nothing
            got.update(ids[a + 1:b][loss[a:b - 1]].tolist())  # loss at j trains on the token at j + 1
    assert sequences == len(CONVS)
    assert got == _trained_targets(cache) and sum(got.values()) > 0
    assert main(["verify", str(tmp_path / "packed")]) == 0


def test_a_stored_mask_of_the_wrong_size_is_refused(tmp_path, hf_dir):
    tok = load_tokenizer(hf_dir)
    cache = tmp_path / "sft"
    build_sft_cache(CONVS, str(cache), tokenizer=tok, val_frac=0.0, seed=0)
    with open(cache / "train_mask.bin", "ab") as f:
        f.write(b"\x01")
    with pytest.raises(NielsGPTError, match="train_mask.bin"):
        pack_sft(cache, tmp_path / "packed", pack_size=128)
    assert not (tmp_path / "packed").exists()
