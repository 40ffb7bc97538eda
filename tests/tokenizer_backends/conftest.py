"""Real tokenizers of each backend, trained in-process on the bundled sample corpus.

- `bpe_json`: a byte-level BPE tokenizer.json (the `tokenizers` library) with `<|endoftext|>`,
  `<|im_start|>` and `<|im_end|>` as special added tokens, and no library chat tokens;
- `hf_dir`: that file in a `transformers`-style directory whose tokenizer_config.json names its EOS and
  a ChatML chat template;
- `tiktoken_file`: the same BPE's ranks written as a `.tiktoken` file (base64 token, space, rank), which
  tiktoken encodes to exactly the ids of the BPE (byte-level BPE merges in rank order).
"""

from __future__ import annotations

import base64
import json
import shutil

import pytest

from ..conftest import sample_texts

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def train_bpe(vocab_size: int = 600):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import Regex, decoders, models, pre_tokenizers, trainers

    from niels_gpt.tokenizer.tiktoken_backend import CL100K_PATTERN

    tok = tokenizers.Tokenizer(models.BPE())
    # cl100k's split regex, as tiktoken applies to a .tiktoken file, then GPT-2's byte table
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(CL100K_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False, special_tokens=[])
    tok.train_from_iterator(sample_texts(), trainer)
    tok.add_special_tokens(SPECIALS)
    return tok


@pytest.fixture(scope="session")
def bpe_json(tmp_path_factory):
    path = tmp_path_factory.mktemp("bpe") / "tokenizer.json"
    train_bpe().save(str(path))
    return path


@pytest.fixture(scope="session")
def hf_dir(tmp_path_factory, bpe_json):
    d = tmp_path_factory.mktemp("hfdir") / "chatml-tok"
    d.mkdir()
    shutil.copy(bpe_json, d / "tokenizer.json")
    (d / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": "<|im_end|>", "bos_token": None, "chat_template": CHATML,
        "tokenizer_class": "PreTrainedTokenizerFast"}))
    return d


@pytest.fixture(scope="session")
def tiktoken_file(tmp_path_factory, bpe_json):
    """The BPE's ranks as a .tiktoken file: byte-level tokens mapped back to their bytes."""
    from niels_gpt.tokenizer.hf import _byte_decoder

    table = _byte_decoder()
    vocab = json.loads(bpe_json.read_text())["model"]["vocab"]
    path = tmp_path_factory.mktemp("tt") / "sample_bpe.tiktoken"
    lines = [base64.b64encode(bytes(table[c] for c in token)).decode() + f" {rank}"
             for token, rank in sorted(vocab.items(), key=lambda kv: kv[1])]
    path.write_text("\n".join(lines) + "\n")
    return path
