"""`train-tokenizer --trainer rustbpe`: a byte-level BPE trained by rustbpe on the bundled sample, written as a
`.tiktoken` tokenizer that carries the library's four chat tokens: byte-identical on a second run, lossless,
encoded by the fast encoder, and building pretraining and SFT caches whose chats are masked as with
sentencepiece."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from niels_gpt.cache.cli import main
from niels_gpt.cache.meta import read_meta
from niels_gpt.errors import TokenizerError
from niels_gpt.sources import SAMPLE_DIR
from niels_gpt.spans import assistant_token_mask
from niels_gpt.tokenizer import SPECIAL_TOKENS, load_tokenizer
from niels_gpt.tokenizer.fast import fast_encoder
from niels_gpt.tokenizer.tiktoken_backend import TiktokenTokenizer

pytest.importorskip("rustbpe")
pytest.importorskip("tiktoken")

VOCAB = 600


def _train(src, out, *extra) -> None:
    assert main(["train-tokenizer", str(src), "--out", str(out), "--vocab-size", str(VOCAB), "--trainer", "rustbpe",
                 "--no-progress", *extra]) == 0


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = tmp_path_factory.mktemp("rustbpe")
    shutil.copytree(SAMPLE_DIR / "roam", d / "data")
    _train(d / "data", d / "tok")
    return d


def test_the_tokenizer_is_the_librarys_with_four_chat_tokens_after_the_ranks(trained):
    tok = load_tokenizer(trained / "tok")
    meta = read_meta(str(trained / "tok"))
    assert isinstance(tok, TiktokenTokenizer) and tok.library_conventions
    assert len(tok) == VOCAB + 4 == meta["vocab_size"]
    assert tok.special_ids == {"sys": VOCAB, "usr": VOCAB + 1, "asst": VOCAB + 2, "eot": VOCAB + 3}
    assert meta["trainer"] == "rustbpe" and meta["tokenizer_sha256"] == tok.sha256
    assert tok.separator.id == tok.special_ids["eot"] and tok.separator.position == "after"
    text = "Holmes said: 'It's 1895!'  \n\tdéjà vu 😀 日本 " + SPECIAL_TOKENS["asst"]
    ids = tok.encode(text)
    assert tok.decode(ids) == text and max(ids) < VOCAB  # a typed sentinel stays text
    assert fast_encoder(tok) is not None  # gigatoken, after its id-for-id check
    assert main(["verify", str(trained / "tok")]) == 0  # the file's sha256 is the one meta.json records


def test_a_second_run_writes_the_same_bytes_and_max_chars_samples(trained, tmp_path):
    _train(trained / "data", tmp_path / "again")
    for name in ("tokenizer.tiktoken", "meta.json"):
        assert (tmp_path / "again" / name).read_bytes() == (trained / "tok" / name).read_bytes()
    _train(trained / "data", tmp_path / "sampled", "--max-chars", "20000", "--doc-chars", "3000")
    stats = read_meta(str(tmp_path / "sampled"))["training_text"]
    assert stats["characters"] == stats["sampled_characters"] <= 20000
    assert stats["sampled_documents"] < stats["sampled_from_documents"]
    assert (tmp_path / "sampled" / "tokenizer.tiktoken").read_bytes() != \
        (trained / "tok" / "tokenizer.tiktoken").read_bytes()


def test_a_pretrain_and_an_sft_cache_built_with_it(trained, tmp_path):
    tok = load_tokenizer(trained / "tok")
    assert main(["build", str(trained / "data"), "--out", str(tmp_path / "caches" / "pre"), "--tokenizer",
                 str(trained / "tok"), "--no-progress"]) == 0
    meta = read_meta(str(tmp_path / "caches" / "pre"))
    assert meta["tokenizer_sha256"] == tok.sha256 and meta["encoder"].startswith("gigatoken")
    assert meta["document_separator"]["id"] == VOCAB + 3 and meta["token_dtype"] == "uint16-le"
    ids = np.concatenate([np.fromfile(tmp_path / "caches" / "pre" / name, dtype="<u2")
                          for name in sorted(meta["files"]) if name.startswith("train/")])
    assert len(ids) == meta["totals"]["train_tokens"] and ids[-1] == VOCAB + 3
    assert int((ids == VOCAB + 3).sum()) == meta["totals"]["train_documents"] and int(ids.max()) == VOCAB + 3
    chats = [{"messages": [{"role": "user", "content": f"What is {i} plus {i}?"},
                           {"role": "assistant", "content": f"{i} plus {i} is {2 * i}."}]} for i in range(12)]
    (tmp_path / "chat").mkdir()
    (tmp_path / "chat" / "c.jsonl").write_text("".join(json.dumps(c) + "\n" for c in chats))
    out = tmp_path / "caches" / "sft"
    assert main(["build", str(tmp_path / "chat"), "--chat", "--out", str(out), "--tokenizer", str(trained / "tok"),
                 "--val-frac", "0", "--no-progress"]) == 0
    meta = read_meta(str(out))
    assert meta["special_token_ids"] == tok.special_ids
    assert meta["encoder"].startswith("gigatoken")  # chat rendering encodes each message with the fast encoder
    offsets = np.load(out / "train_idx.npy")
    tokens = np.fromfile(out / "train_tokens.bin", dtype="<u2")
    ends = [*offsets[1:].tolist(), len(tokens)]
    assert len(offsets) == len(chats)
    for chat, start, end in zip(chats, offsets.tolist(), ends, strict=True):
        stored = tokens[start:end]
        rendered = tok.render_chat(chat["messages"])
        assert stored.tolist() == rendered.ids
        mask = assistant_token_mask(stored.astype(np.int64), tok.special_ids["asst"], tok.special_ids["eot"])
        assert mask.tolist() == rendered.mask
        trained_ids = stored[mask]
        assert trained_ids[-1] == tok.special_ids["eot"]
        assert tok.decode(trained_ids.tolist()) == chat["messages"][1]["content"]


def test_ranks_without_meta_are_an_interrupted_training(trained, tmp_path):
    shutil.copytree(trained / "tok", tmp_path / "tok")
    (tmp_path / "tok" / "meta.json").unlink()
    with pytest.raises(TokenizerError, match="tokenizer.tiktoken without meta.json"):
        load_tokenizer(tmp_path / "tok")


def test_an_edited_record_is_refused_on_open_not_used(trained, tmp_path):
    """The split pattern and special ids in meta.json decide every id: an edit that keeps the JSON valid (a special
    id moved) is refused when the tokenizer is opened, naming the file, as is a record stripped of its seal."""
    shutil.copytree(trained / "tok", tmp_path / "tok")
    meta_path = tmp_path / "tok" / "meta.json"
    meta = json.loads(meta_path.read_text())
    eot = SPECIAL_TOKENS["eot"]
    meta["tiktoken"]["special_tokens"][eot] += 1
    meta_path.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    with pytest.raises(TokenizerError, match=r"meta\.json: its fields do not hash to its record_sha256"):
        load_tokenizer(tmp_path / "tok")
    del meta["record_sha256"]
    meta_path.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    with pytest.raises(TokenizerError, match=r"meta\.json: it carries no record_sha256"):
        load_tokenizer(tmp_path / "tok")
    meta_path.write_bytes((trained / "tok" / "meta.json").read_bytes() + b"}")  # no longer JSON
    with pytest.raises(TokenizerError, match=r"meta\.json: not valid JSON"):
        load_tokenizer(tmp_path / "tok")


def test_progress_names_the_rustbpe_trainer(trained, tmp_path):
    import contextlib
    import io

    from niels_gpt.builders.tokenizer import train_on_sources
    from niels_gpt.tokenizer import TrainSettings

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        train_on_sources([trained / "data"], tmp_path / "tok", settings=TrainSettings(vocab_size=VOCAB),
                         progress=True, trainer="rustbpe")
    text = err.getvalue()
    assert "tokenizer: reading text" in text and f"tokenizer: training (rustbpe, {VOCAB} pieces, about" in text
    assert (tmp_path / "tok" / "tokenizer.tiktoken").read_bytes() == \
        (trained / "tok" / "tokenizer.tiktoken").read_bytes()
