"""A tokenizer other than the one that built the data is refused wherever one is passed (#10, item 8).

Two tokenizers of the same size decode the same ids to different text, so `inspect --tokenizer OTHER` once
printed plausible garbage and a training run scored bits per byte with the wrong byte lengths.
"""

from __future__ import annotations

import pytest

from niels_gpt.cache.cli import main
from niels_gpt.cache.meta import read_meta, write_meta
from niels_gpt.errors import TokenizerError
from niels_gpt.formats.convert import convert
from niels_gpt.packing import pack_sft
from niels_gpt.report import inspect_path
from niels_gpt.tokenizer import TrainSettings, train_tokenizer

from ..conftest import sample_texts, write_sft_cache


@pytest.fixture(scope="module")
def other_tokenizer(tmp_path_factory, tokenizer):
    """Same size as the session tokenizer, trained on other text: same ids, other pieces."""
    texts = sample_texts()[::-1][: max(2, len(sample_texts()) // 2)]
    other = train_tokenizer(texts, tmp_path_factory.mktemp("other"), settings=TrainSettings(vocab_size=2000))
    assert len(other) == len(tokenizer) and other.sha256 != tokenizer.sha256
    return other


def test_inspect_refuses_another_tokenizer_of_the_same_size_on_our_cache(real_cache, tokenizer, other_tokenizer):
    assert "first" in inspect_path(str(real_cache), tokenizer=tokenizer.model_path, window=8)
    with pytest.raises(TokenizerError, match=r"was built with the tokenizer whose sha256 is .*pass the tokenizer"):
        inspect_path(str(real_cache), tokenizer=other_tokenizer.model_path, window=8)


def test_the_cli_says_it_in_one_line(real_cache, other_tokenizer, capsys):
    assert main(["inspect", str(real_cache), "--tokenizer", other_tokenizer.model_path]) != 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "was built with the tokenizer" in err


@pytest.mark.parametrize("to", ["nanogpt", "megatron"])
def test_inspect_refuses_it_on_a_converted_output(to, real_cache, other_tokenizer, tmp_path):
    out = tmp_path / "out"
    convert(real_cache, out, to=to)
    with pytest.raises(TokenizerError, match="was built with the tokenizer"):
        inspect_path(str(out), tokenizer=other_tokenizer.model_path, window=8)


def test_inspect_refuses_it_on_packed_bins(tokenizer, other_tokenizer, tmp_path):
    rows = [tokenizer.render_chat([{"role": "user", "content": f"question {i}"},
                                   {"role": "assistant", "content": f"answer {i}"}]).ids for i in range(6)]
    sft = tmp_path / "sft"
    write_sft_cache(sft, rows)
    meta = read_meta(str(sft))
    write_meta(str(sft), {**meta, "tokenizer_sha256": tokenizer.sha256, "special_token_ids": tokenizer.special_ids})
    packed = tmp_path / "packed"
    pack_sft(str(sft), str(packed), pack_size=64)
    assert "bin 0" in inspect_path(str(packed), tokenizer=tokenizer.model_path, window=8)
    with pytest.raises(TokenizerError, match="was built with the tokenizer"):
        inspect_path(str(packed), tokenizer=other_tokenizer.model_path, window=8)


def test_training_with_an_explicit_tokenizer_of_other_data_is_refused(real_cache, other_tokenizer, tmp_path):
    from niels_gpt.train.train import TrainConfig, train

    cfg = TrainConfig(data=str(real_cache), out_dir=str(tmp_path / "run"), tokenizer=other_tokenizer.model_path,
                      steps=1, depth=1, sequence_len=16, device_batch_size=2, device="cpu")
    with pytest.raises(TokenizerError, match="was built with the tokenizer"):
        train(cfg, log=lambda *a, **k: None)
