"""Long documents are encoded in bounded pieces (niels_gpt/long_documents.py, #10 item 12).

The pieces are cut before a single space between two non-space characters. For byte-level BPE (the
regex pre-tokenizers of GPT-2 style tokenizers) and sentencepiece BPE the ids are exactly those of the
whole document. A sentencepiece *unigram* model picks among equally scored segmentations by float sums
accumulated from the start of its input, so a rare tie can split differently; the test measures it.
"""

from __future__ import annotations

import numpy as np
import pytest

from niels_gpt import long_documents
from niels_gpt.cache.build_cache import build_pretrain_cache
from niels_gpt.long_documents import encode_documents, encode_long, split_points
from niels_gpt.tokenizer import TrainSettings, train_tokenizer

from .conftest import SHARED_DATA, sample_texts


def _long_text() -> str:
    shakespeare = SHARED_DATA / "tinyshakespeare" / "input.txt"
    if shakespeare.is_file():
        return shakespeare.read_text("utf-8")
    return "\n\n".join(sample_texts())


@pytest.fixture(scope="module")
def byte_level_bpe(tmp_path_factory):
    tokenizers = pytest.importorskip("tokenizers")
    from niels_gpt.tokenizer.hf import HFTokenizer, add_special_tokens_to

    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=1500, initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
                                             show_progress=False)
    tok.train_from_iterator(sample_texts(), trainer)
    add_special_tokens_to(tok)
    path = tmp_path_factory.mktemp("bpe") / "tokenizer.json"
    tok.save(str(path))
    return HFTokenizer(path)


@pytest.fixture(scope="module")
def spm_bpe(tmp_path_factory):
    return train_tokenizer(sample_texts(), tmp_path_factory.mktemp("spmbpe"),
                           settings=TrainSettings(vocab_size=1500, model_type="bpe"))


def test_cuts_sit_before_a_single_space_between_non_spaces():
    text = _long_text()
    cuts = split_points(text, 5000)
    assert len(cuts) > 100 and cuts == sorted(set(cuts))
    for c in cuts:
        assert text[c] == " " and not text[c - 1].isspace() and not text[c + 1].isspace()
    gaps = np.diff([0, *cuts])
    assert gaps.max() <= 5000 + 200  # back to the nearest safe space, or a little past the target
    assert split_points("x" * 50_000, 1000) == []  # no space: encoded whole
    assert split_points("a  b" * 10_000, 100) == []  # only double spaces: no safe cut
    assert split_points(text, len(text)) == []


@pytest.mark.parametrize("piece_chars", [333, 4096, 50_000])
@pytest.mark.parametrize("backend", ["byte_level_bpe", "spm_bpe"])
def test_pieces_give_exactly_the_ids_of_the_whole_document(backend, piece_chars, request, monkeypatch):
    tok = request.getfixturevalue(backend)
    text = _long_text()
    whole = np.asarray(tok.encode(text))
    got = encode_long(tok, text, piece_chars)
    assert got.dtype == np.uint32 and np.array_equal(got, whole)  # the fast encoder's pieces
    monkeypatch.setenv("NIELS_GPT_ENCODER", "reference")
    got = encode_long(tok, text, piece_chars)
    assert got.dtype == np.int32 and np.array_equal(got, whole)


@pytest.mark.parametrize("backend", ["byte_level_bpe", "spm_bpe"])
def test_a_long_documents_pieces_go_to_the_fast_encoder(backend, request, monkeypatch):
    """A document longer than LONG_DOCUMENT_CHARS (a whole text file of a few MB) was encoded by the tokenizer's own
    library piece by piece; the fast encoder takes the pieces, with the same ids."""
    tok = request.getfixturevalue(backend)
    text = _long_text()
    whole = np.asarray(tok.encode(text))
    from niels_gpt.tokenizer.fast import fast_encoder

    assert fast_encoder(tok) is not None
    calls = []
    real = type(tok).encode
    monkeypatch.setattr(type(tok), "encode", lambda self, t, *a, **k: calls.append(len(t)) or real(self, t, *a, **k))
    got = encode_documents(tok, ["a short one", text], piece_chars=5000)[1]
    assert np.array_equal(got, whole)
    assert sum(calls) < len(text) // 10, "the pieces were encoded by the reference encoder"


@pytest.fixture(scope="module")
def unigram(tmp_path_factory):
    return train_tokenizer(sample_texts(), tmp_path_factory.mktemp("unigram"),
                           settings=TrainSettings(vocab_size=2000, model_type="unigram"))


def test_a_unigram_model_differs_only_in_rare_ties(unigram):
    tokenizer = unigram
    text = _long_text()
    whole = tokenizer.encode(text)
    got = encode_long(tokenizer, text, 4096).tolist()
    assert tokenizer.decode(got) == text  # lossless whatever the segmentation

    def boundaries(ids):  # character offsets at which tokens end
        ends, pos = set(), 0
        for i in ids:
            pos += len(tokenizer.decode([i]))
            ends.add(pos)
        return ends

    moved = len(boundaries(whole) ^ boundaries(got))
    cuts = len(split_points(text, 4096))
    # measured: 76 moved boundaries over 272 cuts in 489,446 tokens (2 at the real 4 Mi-character pieces)
    assert moved <= 2 * cuts and moved <= len(whole) * 2e-4, (moved, cuts)


def test_short_documents_keep_the_list_path_and_long_ones_become_arrays(byte_level_bpe):
    text = _long_text()[:20_000]
    out = encode_documents(byte_level_bpe, ["short one", text, "another"], piece_chars=5000)
    assert isinstance(out[0], list) and isinstance(out[2], list) and isinstance(out[1], np.ndarray)
    assert out[1].tolist() == byte_level_bpe.encode(text)


def test_a_cache_with_a_long_document_is_byte_identical_to_encoding_it_whole(byte_level_bpe, tmp_path, monkeypatch):
    docs = ["a first short document.", _long_text()[:60_000], "a last one."]

    def build(out):
        build_pretrain_cache(docs, str(out), tokenizer=byte_level_bpe, max_train_tokens=10**9, max_val_tokens=50,
                             seed=3, shuffle_buffer=None, progress=False, num_workers=1, shard_bytes=8192)
        return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}

    whole = build(tmp_path / "a" / "cache")  # 60,000 characters: one piece
    monkeypatch.setattr(long_documents, "LONG_DOCUMENT_CHARS", 7000)
    pieces = build(tmp_path / "b" / "cache")
    assert sorted(pieces) == sorted(whole)
    for name in whole:
        assert pieces[name] == whole[name], name
