"""Each backend, picked by what the path is, with the tokenizer's own conventions."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from niels_gpt.errors import TokenizerError
from niels_gpt.tokenizer import load_tokenizer

from ..conftest import sample_texts

pytest.importorskip("tokenizers")

TEXT = "The quick brown fox, 1234 times: «naïve» 漢字 🦜\n\tindented <|endoftext|> literal"


def test_backend_is_picked_by_what_the_path_is(tokenizer, bpe_json, hf_dir, tiktoken_file):
    assert load_tokenizer(tokenizer.model_path).backend == "sentencepiece"
    assert load_tokenizer(bpe_json).backend == "hf-tokenizers"
    assert load_tokenizer(hf_dir).backend == "hf-tokenizers"
    assert load_tokenizer(tiktoken_file).backend == "tiktoken"


def test_tokenizer_json_without_library_tokens_keeps_its_own_eos(bpe_json):
    tok = load_tokenizer(bpe_json)
    eos = tok.token_to_id("<|endoftext|>")
    assert not tok.library_conventions
    assert tok.special_ids == {"sys": None, "usr": None, "asst": None, "eot": eos}
    assert tok.separator == ("eot", eos, "after")
    assert tok.decode(tok.encode(TEXT)) == TEXT
    assert eos not in tok.encode(TEXT)  # the literal string in text stays text


def test_transformers_directory_takes_eos_and_template_from_its_config(hf_dir):
    tok = load_tokenizer(hf_dir)
    assert tok.separator.id == tok.token_to_id("<|im_end|>")
    assert tok.chat_template is not None and tok.bos_id is None


def test_eos_and_bos_overrides_by_text_or_id(bpe_json):
    tok = load_tokenizer(bpe_json, eos="<|im_end|>")
    assert tok.separator.id == tok.token_to_id("<|im_end|>")
    tok = load_tokenizer(bpe_json, bos="<|im_start|>", separator="bos")
    assert tok.separator == ("bos", tok.token_to_id("<|im_start|>"), "before")
    assert load_tokenizer(bpe_json, eos=5).separator.id == 5
    again = pickle.loads(pickle.dumps(tok))  # pickles with the conventions it was loaded with
    assert again.separator == tok.separator


def test_rejects_an_eos_that_is_not_a_token(bpe_json):
    with pytest.raises(TokenizerError, match=r"tokenizer.json: --eos '<nope>' is not a token of this tokenizer"):
        load_tokenizer(bpe_json, eos="<nope>")
    with pytest.raises(TokenizerError, match=r"tokenizer.json: --bos 999999: id outside the vocabulary"):
        load_tokenizer(bpe_json, bos=999999)


def test_rejects_a_bos_separator_when_the_tokenizer_has_no_bos(hf_dir):
    tok = load_tokenizer(hf_dir, separator="bos")
    with pytest.raises(TokenizerError, match=r"chatml-tok/tokenizer.json: separator 'bos' asked for, but the "
                                             r"tokenizer has no BOS token; name one with --bos"):
        _ = tok.separator


def test_rejects_a_tokenizer_without_any_end_of_text(tmp_path):
    import tokenizers

    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tok.save(str(tmp_path / "tokenizer.json"))
    t = load_tokenizer(tmp_path / "tokenizer.json")
    with pytest.raises(TokenizerError, match=r"tokenizer.json: no end-of-text token found .* --eos TOKEN"):
        _ = t.separator


def test_rejects_a_config_eos_missing_from_the_vocabulary(tmp_path, bpe_json):
    (tmp_path / "tokenizer.json").write_bytes(bpe_json.read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "</s>"}}))
    with pytest.raises(TokenizerError, match=r"tokenizer_config.json: eos_token '</s>' is not in .*tokenizer.json"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{broken")
    with pytest.raises(TokenizerError, match=r"tokenizer_config.json: not valid JSON"):
        load_tokenizer(tmp_path)


def test_library_tokenizer_refuses_another_eos(tokenizer):
    with pytest.raises(TokenizerError, match=r"spm.model: the library's tokenizer ends documents with its own EOT"):
        load_tokenizer(tokenizer.model_path, eos="</s>")


def test_decode_keeps_special_tokens_when_asked(tokenizer, bpe_json, tiktoken_file):
    chat = tokenizer.render_chat([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])
    kept = tokenizer.decode(chat.ids, skip_special_tokens=False)
    assert kept.count("<|ngpt_eot_") == 2 and "hi" in kept
    assert tokenizer.decode(chat.ids) == "hiyo"
    for path in (bpe_json, tiktoken_file):
        tok = load_tokenizer(path)
        ids = tok.encode("one") + [tok.separator.id] + tok.encode("two")
        assert tok.decode(ids, skip_special_tokens=False) == "one<|endoftext|>two"
        assert tok.decode(ids) == "onetwo"


def test_tiktoken_file_encodes_exactly_like_the_bpe_it_came_from(bpe_json, tiktoken_file):
    hf, tt = load_tokenizer(bpe_json), load_tokenizer(tiktoken_file)
    docs = sample_texts()[:6] + [TEXT]
    assert tt.encode_batch(docs, num_threads=2) == [hf.encode(d) for d in docs] == hf.encode_batch(docs)
    assert tt.decode(tt.encode(TEXT)) == TEXT
    assert tt.separator == ("eot", hf.token_to_id("<|endoftext|>"), "after")
    assert len(tt) == hf.token_to_id("<|endoftext|>") + 1
    lengths = tt.token_byte_lengths()
    ids = tt.encode(TEXT)
    assert int(lengths[ids].sum()) == len(TEXT.encode("utf-8")) and lengths[tt.separator.id] == 0
    assert np.array_equal(lengths[:len(tt) - 1], hf.token_byte_lengths()[:len(tt) - 1])


def test_tiktoken_arrays_hold_the_ids_of_encode(tiktoken_file):
    pytest.importorskip("tiktoken")
    tt = load_tokenizer(tiktoken_file)
    docs = sample_texts()[:6] + [TEXT, "", "typed <|endoftext|> stays text", "lone \ud800 surrogate"]
    arrays = tt.encode_batch_arrays(docs)
    assert all(a.dtype == np.uint32 for a in arrays)
    assert [a.tolist() for a in arrays] == [tt.encode(d) for d in docs]


def test_rejects_a_malformed_tiktoken_file(tmp_path):
    pytest.importorskip("tiktoken")
    bad = tmp_path / "bad.tiktoken"
    bad.write_text("not-base64!! x\n")
    with pytest.raises(TokenizerError, match=r"bad.tiktoken: not a .tiktoken file"):
        load_tokenizer(bad)
    with pytest.raises(TokenizerError, match=r"no .tiktoken file at .*missing.tiktoken"):
        load_tokenizer(tmp_path / "missing.tiktoken")


def test_tiktoken_encoding_name_missing_from_the_cache_names_the_cache(tmp_path, monkeypatch):
    pytest.importorskip("tiktoken")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty-cache"))
    with pytest.raises(TokenizerError, match=r"tiktoken encoding 'cl100k_base' is not in its cache .*empty-cache"):
        load_tokenizer("cl100k_base")


def test_tiktoken_encoding_name_opens_a_registered_encoding(monkeypatch, tiktoken_file, bpe_json):
    """A name goes through tiktoken.get_encoding: here one registered like tiktoken_ext's plugins register theirs."""
    tiktoken = pytest.importorskip("tiktoken")
    from tiktoken.load import load_tiktoken_bpe

    from niels_gpt.tokenizer.tiktoken_backend import CL100K_PATTERN

    ranks = load_tiktoken_bpe(str(tiktoken_file))

    def sample_base():
        return {"name": "sample_base", "pat_str": CL100K_PATTERN, "mergeable_ranks": ranks,
                "special_tokens": {"<|endoftext|>": len(ranks)}}

    tiktoken.registry.list_encoding_names()  # loads the plugins first, so ours is not overwritten
    monkeypatch.setitem(tiktoken.registry.ENCODING_CONSTRUCTORS, "sample_base", sample_base)
    tok = load_tokenizer("sample_base")
    assert tok.backend == "tiktoken" and tok.model_path == "sample_base"
    assert tok.encode(TEXT) == load_tokenizer(bpe_json).encode(TEXT)
    assert pickle.loads(pickle.dumps(tok)).sha256 == tok.sha256 == load_tokenizer("sample_base").sha256


def test_hub_id_resolves_to_a_local_snapshot_and_loads_like_a_directory(monkeypatch, hf_dir):
    import niels_gpt.tokenizer as tokenizer_module

    monkeypatch.setattr(tokenizer_module, "hub_tokenizer_dir", lambda repo_id: hf_dir)  # the hub's snapshot
    tok = load_tokenizer("someone/chat-model")
    assert tok.chat_template is not None and tok.separator.id == tok.token_to_id("<|im_end|>")


def test_unreachable_hub_id_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    with pytest.raises(TokenizerError, match=r"someone/missing-model: no such local path, and the Hugging Face hub "
                                             r"repository could not be fetched"):
        load_tokenizer("someone/missing-model")


def test_vocabulary_above_65535_is_stored_as_uint32(tmp_path):
    """A real .tiktoken file of 65,792 ranks (every byte, then every byte pair, last first): ids above 65,535
    (pairs starting with a NUL byte) reach the cache."""
    pytest.importorskip("tiktoken")
    import base64

    from niels_gpt.cache.build_cache import build_pretrain_cache

    pairs = [bytes([a, b]) for a in range(256) for b in range(256)][::-1]
    tokens = [bytes([i]) for i in range(256)] + pairs
    path = tmp_path / "wide.tiktoken"
    path.write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for r, t in enumerate(tokens)))
    tok = load_tokenizer(path)
    assert len(tok) == 65_793 and tok.token_dtype == np.dtype("<u4")
    text = "\x00a\x00b wide ids"
    build_pretrain_cache([text], str(tmp_path / "c"), tokenizer=tok, max_train_tokens=1000, max_val_tokens=0,
                         shard_bytes=1 << 20, seed=0, shuffle_buffer=None)
    ids = np.fromfile(tmp_path / "c" / "train" / "shard_00000.bin", dtype="<u4").tolist()
    assert ids == tok.encode(text) + [65_792] and max(ids[:-1]) > 65_535
    assert tok.decode(ids) == text


def test_the_published_encodings_table_is_tiktokens_own(monkeypatch):
    """PUBLISHED (file sha256 -> name, regex, special tokens) against the constructors tiktoken ships: each is
    called with its download replaced by a recorder of the hash it would check the file against."""
    pytest.importorskip("tiktoken")
    openai_public = pytest.importorskip("tiktoken_ext.openai_public")
    from niels_gpt.tokenizer.tiktoken_backend import PUBLISHED

    seen = {}

    def recorder(url, expected_hash=None):
        seen["hash"] = expected_hash
        return {}

    monkeypatch.setattr(openai_public, "load_tiktoken_bpe", recorder)
    for name in ("r50k_base", "p50k_base", "cl100k_base", "o200k_base"):
        spec = getattr(openai_public, name)()
        assert PUBLISHED[seen["hash"]] == (name, spec["pat_str"], spec["special_tokens"])
    assert len(PUBLISHED) == 4


def test_a_published_tiktoken_file_is_its_named_encoding(tmp_path, monkeypatch, tiktoken_file):
    """A file tiktoken would accept as a published encoding gets that encoding's regex, special tokens and
    sha256, not the generic <|endoftext|> after the last rank (here the sample BPE file stands in for one)."""
    import hashlib

    pytest.importorskip("tiktoken")
    from niels_gpt.tokenizer import tiktoken_backend as tb

    generic = load_tokenizer(tiktoken_file)
    n = len(generic) - 1  # ranks in the file
    assert generic.eot_id == n and generic.sha256 == hashlib.sha256(tiktoken_file.read_bytes()).hexdigest()
    specials = {"<|endoftext|>": n + 5, "<|endofprompt|>": n + 9}
    monkeypatch.setitem(tb.PUBLISHED, hashlib.sha256(tiktoken_file.read_bytes()).hexdigest(),
                        ("sample_base", tb.CL100K_PATTERN, specials))
    tok = load_tokenizer(tiktoken_file)
    assert tok.eot_id == n + 5 and len(tok) == n + 10 and tok._enc.name == "sample_base"
    assert tok.sha256 == tb.encoding_sha256(tok._enc) != generic.sha256
    text = "\n".join(sample_texts())[:5000]
    assert tok.encode(text) == generic.encode(text)


def test_cl100k_base_as_a_file_and_by_name_are_one_tokenizer(tmp_path):
    """With cl100k_base in tiktoken's cache (TIKTOKEN_CACHE_DIR), its ranks written out are the published file
    byte for byte, and opening that file gives the named encoding: same ids, same EOT (100257), same sha256."""
    import base64
    import hashlib

    pytest.importorskip("tiktoken")
    try:
        named = load_tokenizer("cl100k_base")
    except TokenizerError:
        pytest.skip("cl100k_base is not in tiktoken's cache here (no network)")
    ranks = sorted(named._enc._mergeable_ranks.items(), key=lambda kv: kv[1])
    path = tmp_path / "cl100k_base.tiktoken"
    path.write_bytes("".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in ranks).encode())
    from niels_gpt.tokenizer.tiktoken_backend import PUBLISHED

    assert hashlib.sha256(path.read_bytes()).hexdigest() in PUBLISHED
    tok = load_tokenizer(path)
    assert (tok.eot_id, len(tok), tok.sha256) == (named.eot_id, len(named), named.sha256) == (100257, 100277,
                                                                                               named.sha256)
    text = "\n".join(sample_texts())[:20000]
    assert tok.encode(text) == named.encode(text)


def test_a_replaced_tiktoken_file_is_read_again_and_not_copied_to_a_cache(tmp_path, monkeypatch, tiktoken_file):
    """tiktoken's loader caches local paths by name; ours reads the file itself: a file replaced at the same
    path gives the new ranks and sha256, and nothing is written to tiktoken's cache directory."""
    pytest.importorskip("tiktoken")
    cache = tmp_path / "tiktoken-cache"
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    path = tmp_path / "ranks.tiktoken"
    lines = tiktoken_file.read_text().splitlines()
    path.write_text("\n".join(lines) + "\n")
    first = load_tokenizer(path)
    path.write_text("\n".join(lines[:300]) + "\n")  # the same path, fewer ranks
    second = load_tokenizer(path)
    assert len(first) == len(lines) + 1 and len(second) == 301 and second.sha256 != first.sha256
    assert not cache.exists() or not any(cache.iterdir())
    path.write_text("\n".join(lines[:5] + ["QUJD notanumber"]) + "\n")
    with pytest.raises(TokenizerError, match=r"ranks.tiktoken: not a .tiktoken file .* line 6: b'QUJD notanumber'"):
        load_tokenizer(path)
