"""uint32 end to end: a Hugging Face tokenizer with 70,006 ids -> cache -> every format -> datasets."""

from __future__ import annotations

import hashlib
import pickle

import numpy as np
import pytest

from niels_gpt.cache.formats import detect_format
from niels_gpt.errors import ConfigError, TokenizerError
from niels_gpt.formats.convert import convert
from niels_gpt.formats.kempner_dataset import MemoryMappedDataset
from niels_gpt.formats.nanogpt_dataset import NanogptDataset
from niels_gpt.tokenizer import EOT_TOKEN, load_tokenizer

pytest.importorskip("tokenizers")


def test_hf_tokenizer_contract(big_tokenizer):
    tok = big_tokenizer
    assert len(tok) == 70_006 and tok.token_dtype == np.dtype("<u4")
    assert tok.special_ids == {"sys": 70_002, "usr": 70_003, "asst": 70_004, "eot": 70_005}
    assert tok.bos_id == 1
    assert tok.sha256 == hashlib.sha256(open(tok.model_path, "rb").read()).hexdigest()
    assert tok.encode("w0 w69999") == [2, 70_001]
    assert tok.encode_batch(["w1", "w2 w3"]) == [[3], [4, 5]]
    assert tok.decode([2, 70_001]) == "w0 w69999"
    lengths = tok.token_byte_lengths()
    assert lengths.shape == (70_006,) and lengths[2] == 2 and lengths[70_001] == 6 and lengths[70_005] == 0
    assert pickle.loads(pickle.dumps(tok)).encode("w5") == [7]
    assert type(load_tokenizer(tok.model_path.rsplit("/", 1)[0])).__name__ == "HFTokenizer"


def test_literal_special_text_never_becomes_a_special_id(big_tokenizer):
    ids = big_tokenizer.encode(f"w1 {EOT_TOKEN} w2")
    assert 70_005 not in ids and ids[0] == 3 and ids[-1] == 4
    chat = big_tokenizer.render_chat([{"role": "user", "content": "w1"}, {"role": "assistant", "content": "w2"}])
    assert chat.ids == [70_003, 3, 70_005, 70_004, 4, 70_005]


def test_tokenizer_with_only_some_of_our_specials_is_rejected(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from niels_gpt.tokenizer.hf import HFTokenizer
    from niels_gpt.tokenizer.special import EOT_TOKEN

    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tok.add_special_tokens([EOT_TOKEN])
    tok.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(TokenizerError, match="tokenizer.json: special token .* is missing or not a special added token"):
        HFTokenizer(tmp_path / "tokenizer.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="not a Hugging Face tokenizer.json"):
        HFTokenizer(tmp_path / "bad.json")


@pytest.fixture(scope="module")
def big_cache(big_tokenizer, tmp_path_factory):
    from niels_gpt.cache.build_cache import build_pretrain_cache

    docs = [" ".join(f"w{(i * 7919 + j * 104729) % 70_000}" for j in range(5 + i % 23)) for i in range(400)]
    out = tmp_path_factory.mktemp("big") / "cache"
    build_pretrain_cache(docs, str(out), tokenizer=big_tokenizer, max_train_tokens=4_000, max_val_tokens=500,
                         shard_bytes=4_096, seed=1, shuffle_buffer=None)
    return out


def test_uint32_cache_builds_converts_and_serves(big_cache, big_tokenizer, tmp_path, read_tokens):
    info = detect_format(big_cache)
    assert info.dtype == np.dtype("<u4") and info.meta["token_dtype"] == "uint32-le"
    original = read_tokens(big_cache)
    assert max(original["train"]) > 65_535
    for target in ("nanogpt", "kempner-npy", "raw", "megatron", "niels"):
        out = tmp_path / target
        convert(big_cache, out, to=target, bos_index=target == "nanogpt")
        assert detect_format(out).dtype.itemsize == 4
        convert(out, tmp_path / f"{target}-back", to="niels")
        assert read_tokens(tmp_path / f"{target}-back") == original, target
    with pytest.raises(ConfigError, match="holds only uint16 tokens"):
        convert(big_cache, tmp_path / "legacy", to="nanogpt-legacy")

    eot = big_tokenizer.eot_id
    ds = MemoryMappedDataset(tmp_path / "kempner-npy" / "train", seq_len=16, pack_sequences=True)
    assert ds.eos_token_id == eot
    sample = ds[3]
    assert sample["input_ids"].max().item() > 65_535 or ds[4]["input_ids"].max().item() > 65_535
    window = original["train"][3 * 17:4 * 17]
    assert sample["input_ids"].tolist() == window[:-1]
    nd = NanogptDataset(str(tmp_path / "nanogpt" / "train"), 16, align_to_bos=True)
    first = next(iter(nd))
    assert nd.bos_token == eot and first["input_ids"][0].item() == eot
    assert max(int(s["input_ids"].max()) for s in nd) > 65_535
