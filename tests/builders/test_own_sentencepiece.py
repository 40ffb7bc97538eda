"""Any sentencepiece model: a Llama/Mistral-style `.model` (its own `<s>`, `</s>`, byte fallback, none of the
library's sentinels) builds pretraining caches with its own EOS, and chat caches with a template (a
tokenizer_config.json beside it, or --chat-template FILE). The model is trained here with sentencepiece's own
trainer, tiny, as a stand-in for Mistral's."""

from __future__ import annotations

import json

import numpy as np
import pytest

from niels_gpt.cache.cli import main
from niels_gpt.cache.meta import read_meta
from niels_gpt.tokenizer import load_tokenizer

from ..conftest import sample_texts

spm = pytest.importorskip("sentencepiece")

# Mistral's template, in short: [INST] user [/INST] assistant</s>
TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
            "{% elif m['role'] == 'assistant' %} {{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}")


@pytest.fixture(scope="module")
def mistral_like(tmp_path_factory):
    d = tmp_path_factory.mktemp("mistral")
    import io

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter([t for t in sample_texts()[:40] if t.strip()]),
                                   model_writer=model, model_type="bpe", vocab_size=600, byte_fallback=True,
                                   character_coverage=1.0, user_defined_symbols=[], control_symbols=["[INST]", "[/INST]"],
                                   bos_id=1, eos_id=2, unk_id=0, pad_id=-1, num_threads=1, minloglevel=2)
    (d / "tokenizer.model").write_bytes(model.getvalue())
    return d / "tokenizer.model"


def _corpus(tmp_path, rows):
    f = tmp_path / "data.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f


def test_a_model_of_its_own_loads_and_builds_pretraining_with_its_own_eos(tmp_path, mistral_like):
    tok = load_tokenizer(mistral_like)
    assert not tok.library_conventions and tok.special_ids["eot"] == 2 and tok.bos_id == 1
    texts = ["It was a dark and stormy night.", "Café au lait, s'il vous plaît ✓"]
    src = _corpus(tmp_path, [{"text": t} for t in texts])
    for name, extra in (("own", []), ("named", ["--eos", "</s>"])):
        assert main(["build", str(src), "--out", str(tmp_path / name), "--tokenizer", str(mistral_like),
                     "--no-progress", *extra]) == 0
        got = np.fromfile(next((tmp_path / name / "train").glob("shard_*.bin")), dtype="<u2").tolist()
        assert got == [i for t in texts for i in tok.encode(t) + [2]]
        assert read_meta(str(tmp_path / name))["document_separator"]["id"] == 2
    assert main(["build", str(src), "--out", str(tmp_path / "bos"), "--tokenizer", str(mistral_like),
                 "--separator", "bos", "--no-progress"]) == 0
    got = np.fromfile(next((tmp_path / "bos" / "train").glob("shard_*.bin")), dtype="<u2").tolist()
    assert got == [i for t in texts for i in [1] + tok.encode(t)]


def _sft_mask(out):
    ids = np.fromfile(out / "train_tokens.bin", dtype="<u2")
    mask = np.fromfile(out / "train_mask.bin", dtype=np.uint8) if (out / "train_mask.bin").exists() else None
    return ids, mask


@pytest.mark.parametrize("how", ["config beside the model", "--chat-template FILE"])
def test_a_model_of_its_own_builds_chats_with_a_template_and_trains_the_assistant_only(tmp_path, mistral_like, how):
    d = tmp_path / "tok"
    d.mkdir()
    (d / "tokenizer.model").write_bytes(mistral_like.read_bytes())
    extra = []
    if how == "config beside the model":
        (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    else:
        (tmp_path / "chat.jinja").write_text(TEMPLATE)
        extra = ["--chat-template", str(tmp_path / "chat.jinja")]
    chats = [{"messages": [{"role": "user", "content": "Who wrote Emma?"},
                           {"role": "assistant", "content": "Jane Austen wrote it."}]}]
    src = _corpus(tmp_path, chats)
    out = tmp_path / "sft"
    assert main(["build", str(src), "--chat", "--out", str(out), "--tokenizer", str(d / "tokenizer.model"),
                 "--no-progress", *extra]) == 0
    tok = load_tokenizer(d / "tokenizer.model", **({"chat_template": tmp_path / "chat.jinja"} if extra else {}))
    rendered = tok.render_chat(chats[0]["messages"])
    ids = rendered.ids
    assert ids[0] == 1 and ids[-1] == 2 and tok.token_to_id("[INST]") in ids and tok.token_to_id("[/INST]") in ids
    trained = [i for i, m in zip(ids, rendered.mask, strict=True) if m]
    assert tok.decode(trained).strip() == "Jane Austen wrote it." and trained[-1] == 2
    meta = read_meta(str(out))
    assert meta["totals"]["train_examples"] + meta["totals"]["val_examples"] == 1
    assert meta["tokenizer"]["chat_template_sha256"]


def test_each_token_of_a_rendered_chat_starts_at_its_character(mistral_like, tmp_path):
    """encode_rendered's offsets are characters, not bytes, whatever the text holds (accents, emoji, CJK, a
    control piece between them): each id's start is where its piece begins, counted in characters; the batch
    call (one sentencepiece call for every text, on threads) gives each text's own."""
    (tmp_path / "t.jinja").write_text(TEMPLATE)
    tok = load_tokenizer(mistral_like, chat_template=str(tmp_path / "t.jinja"))
    text = "<s>[INST] Café ✓ 日本語 😀 naïve [/INST] Ünïcödé 🇩🇪 ok</s>[INST] plain [/INST] done</s>"
    ids, starts = tok.encode_rendered(text)
    assert len(ids) == len(starts) and starts == sorted(starts) and 0 <= starts[0] and starts[-1] < len(text)
    pieces = [tok.id_to_piece(i) for i in ids]
    for piece, start, nxt in zip(pieces, starts, [*starts[1:], len(text)], strict=True):
        if piece in ("<s>", "</s>", "[INST]", "[/INST]"):
            assert text[start:start + len(piece)] == piece
        elif not piece.startswith("<0x"):  # a byte-fallback piece may start inside its character
            word = piece.replace("\u2581", " ")
            assert text[start:nxt].replace(" ", "") == word.replace(" ", ""), (piece, text[start:nxt])
    assert ids[starts.index(text.index("[/INST]"))] == tok.token_to_id("[/INST]")
    others = ["", "plain words", "[INST][/INST]", "<s>[INST] Ünï 😀 [/INST] ok</s>" * 3]
    assert tok.encode_rendered_batch([text, *others]) == [tok.encode_rendered(t) for t in [text, *others]]
