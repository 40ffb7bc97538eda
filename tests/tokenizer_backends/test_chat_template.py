"""Chat rendering with the tokenizer's own template; the assistant mask from the rendered spans."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from niels_gpt.cache.build_cache import build_sft_cache
from niels_gpt.cache.meta import read_meta
from niels_gpt.cache.sft_dataset import SFTExampleDataset
from niels_gpt.errors import ConfigError, TokenizerError
from niels_gpt.tokenizer import load_tokenizer

from .conftest import CHATML

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

CONV = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another?"},
        {"role": "assistant", "content": "Green <|im_end|> literal."}]


def trained_text(tok, chat) -> list[str]:
    """The trained runs of a rendered chat, decoded with special tokens kept."""
    runs, run = [], []
    for i, m in zip(chat.ids, chat.mask, strict=True):
        if m:
            run.append(i)
        elif run:
            runs.append(tok.decode(run, skip_special_tokens=False))
            run = []
    if run:
        runs.append(tok.decode(run, skip_special_tokens=False))
    return runs


def test_template_renders_like_apply_chat_template_and_masks_assistant_turns(hf_dir):
    tok = load_tokenizer(hf_dir)
    chat = tok.render_chat(CONV)
    text = tok.decode(chat.ids, skip_special_tokens=False)
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n")
    assert trained_text(tok, chat) == ["Blue.<|im_end|>\n", "Green <|im_end|> literal.<|im_end|>\n"]
    im_end = tok.token_to_id("<|im_end|>")
    # as apply_chat_template does, the rendered text is encoded whole with special tokens parsed, so the
    # marker typed in the content is a special id too (5 from the template, 1 from the content)
    assert chat.ids.count(im_end) == 6
    assert tok.token_to_id("<|im_start|>") in chat.ids


def test_sft_cache_with_a_template_stores_the_mask_and_the_dataset_trains_on_it(tmp_path, hf_dir):
    tok = load_tokenizer(hf_dir)
    convs = [CONV, CONV[:3], [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]]
    build_sft_cache(convs, str(tmp_path / "sft"), tokenizer=tok, val_frac=0.0, seed=0)
    meta = read_meta(str(tmp_path / "sft"))
    assert meta["assistant_mask"]["file"] == "{split}_mask.bin" and "chat template" in meta["rendering"]
    assert meta["special_token_ids"]["asst"] is None and meta["special_token_ids"]["eot"] == tok.separator.id
    mask = np.fromfile(tmp_path / "sft" / "train_mask.bin", dtype=np.uint8)
    assert len(mask) == meta["totals"]["train_tokens"] == meta["files"]["train_mask.bin"]["bytes"]
    ds = SFTExampleDataset(str(tmp_path / "sft" / "train_tokens.bin"), str(tmp_path / "sft" / "train_idx.npy"),
                           T=64, device="cpu", eot_id=tok.eot_id)
    for i, conv in enumerate(convs):
        x, y, ym = ds.collate(np.array([i]))
        kept = [t for t in ym[0].tolist() if t != -100]
        expected = [t for t, m in zip(*tok.render_chat(conv), strict=True) if m]
        assert kept == expected[:len(kept)] and kept
    x, y, ym = ds.get_batch(B=4, generator=torch.Generator().manual_seed(0))
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert ds.trained(0).tolist() == tok.render_chat(convs[0]).mask

    from niels_gpt.report import inspect_path, verify_outputs

    shown = inspect_path(str(tmp_path / "sft"), tokenizer=str(hf_dir), window=64)
    # the tokenizer's own special tokens, by their own names: <|im_end|> trained, <|im_start|> shown, not hidden
    assert "⟦Blue.<|im_end|>\n⟧<|im_start|>user" in shown.replace("⟧⟦", "")
    assert "<|eot|>" not in shown
    problems, checked, _ = verify_outputs(str(tmp_path / "sft"))
    assert problems == [] and checked == 1


def test_sft_cache_with_library_tokenizer_has_no_mask_file(tmp_path, tokenizer):
    build_sft_cache([CONV], str(tmp_path / "sft"), tokenizer=tokenizer, val_frac=0.0, seed=0)
    assert not list((tmp_path / "sft").glob("*_mask.bin"))
    assert "assistant_mask" not in read_meta(str(tmp_path / "sft"))


def test_rejects_a_template_that_rewrites_earlier_turns(tmp_path, bpe_json):
    (tmp_path / "tokenizer.json").write_bytes(bpe_json.read_bytes())
    rewriting = "{% for m in messages %}{{ m['role'] }}{{ loop.length }}: {{ m['content'] }}\n{% endfor %}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>",
                                                                "chat_template": rewriting}))
    tok = load_tokenizer(tmp_path)
    with pytest.raises(ConfigError, match=r"message 1 \(assistant\): the chat template of .*tokenizer.json renders"):
        tok.render_chat(CONV[1:3])
    with pytest.raises(ConfigError, match=r"sft example 0: message 1 \(assistant\)"):
        build_sft_cache([CONV[1:3]], str(tmp_path / "sft"), tokenizer=tok, val_frac=0.0, seed=0)
    assert not (tmp_path / "sft" / "meta.json").exists()


def test_template_raise_exception_is_a_clear_error(tmp_path, bpe_json):
    (tmp_path / "tokenizer.json").write_bytes(bpe_json.read_bytes())
    strict = "{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}x"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": strict}))
    with pytest.raises(ConfigError, match=r"chat template of .*tokenizer.json refused this conversation: no system"):
        load_tokenizer(tmp_path).render_chat(CONV)


def test_rejects_chat_with_a_tokenizer_that_has_neither_template_nor_sentinels(bpe_json, tiktoken_file):
    for path in (bpe_json, tiktoken_file):
        with pytest.raises(TokenizerError, match=rf"{path.name}: this tokenizer has no chat template"):
            load_tokenizer(path).render_chat(CONV)


# transformers' assistant-mask form: what the model generates is marked, the rest of the template is as usual;
# this one also numbers each turn by the conversation's length, so rendering a prefix rewrites earlier turns
GENERATION = ("{% for m in messages %}{% if m['role'] == 'assistant' %}<|im_start|>assistant {{ loop.length }}\n"
              "{% generation %}{{ m['content'] }}<|im_end|>{% endgeneration %}{{ '\\n' }}"
              "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture
def generation_dir(tmp_path, bpe_json):
    d = tmp_path / "gen-tok"
    d.mkdir()
    (d / "tokenizer.json").write_bytes(bpe_json.read_bytes())
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "bos_token": None,
                                                         "chat_template": GENERATION}))
    return d


def test_generation_markers_give_the_assistant_mask(generation_dir):
    tok = load_tokenizer(generation_dir)
    chat = tok.render_chat(CONV)
    text = tok.decode(chat.ids, skip_special_tokens=False)
    assert "<|im_start|>assistant 5\nBlue.<|im_end|>\n" in text and "{%" not in text
    # exactly the marked text: the newline after <|im_end|> and the numbered header are not trained
    assert trained_text(tok, chat) == ["Blue.<|im_end|>", "Green <|im_end|> literal.<|im_end|>"]
    assert tok.render_chat(CONV[:2]).mask == [False] * len(tok.render_chat(CONV[:2]).ids)  # nothing generated


def test_an_sft_cache_built_with_generation_markers_stores_their_mask(tmp_path, generation_dir):
    tok = load_tokenizer(generation_dir)
    convs = [CONV, CONV[1:3]]
    build_sft_cache(convs, str(tmp_path / "sft"), tokenizer=tok, val_frac=0.0, seed=0, num_workers=2)
    mask = np.fromfile(tmp_path / "sft" / "train_mask.bin", dtype=np.uint8).tolist()
    assert mask == [int(m) for conv in convs for m in tok.render_chat(conv).mask]


def test_a_template_build_encodes_runs_of_conversations_in_one_call_and_writes_each_as_render_chat(
        tmp_path, hf_dir):
    """Inline, a chat template's texts are encoded a run of conversations a call (on a thread while the next
    run renders); a parallel build's tasks one by one: the files are the same, each stored example is
    render_chat's ids and mask, skipped conversations are counted wherever they fall, and a refused one past
    the first run is named by its index."""
    from niels_gpt.builders.run import BuildSpec, build

    tok = load_tokenizer(hf_dir)
    convs = [[{"role": "user", "content": f"Question {i}: {'why ' * (i % 7)}?"},
              {"role": "assistant", "content": f"Answer {i}." + " more" * (i % 5)}] for i in range(700)]
    convs[3], convs[300] = [], [{"role": "user", "content": "no answer"}]
    src = tmp_path / "chats.jsonl"
    src.write_text("".join(json.dumps({"messages": c}) + "\n" for c in convs), encoding="utf-8")
    files = {}
    for executor in ("inline", "processes"):
        out = tmp_path / executor / "c"
        build(BuildSpec(sources=[str(src)], out=str(out), tokenizer=str(hf_dir), chat=True, executor=executor,
                        workers=2, task_bytes=8_000, progress=False), None)
        files[executor] = {p.name: p.read_bytes() for p in out.iterdir() if p.name != "meta.json"}
        meta = read_meta(str(out))
        assert meta["skipped"] == {"empty_conversation": 1, "no_assistant_turn": 1}
    assert files["inline"] == files["processes"]
    tokens = np.frombuffer(files["inline"]["train_tokens.bin"], dtype="<u2")
    mask = np.frombuffer(files["inline"]["train_mask.bin"], dtype=np.uint8)
    starts = np.load(tmp_path / "inline" / "c" / "train_idx.npy").tolist() + [len(tokens)]
    kept = [c for k, c in enumerate(convs) if k not in (3, 300)]
    assert len(starts) == len(kept) + 1
    for conv, a, b in zip(kept, starts, starts[1:], strict=False):
        chat = tok.render_chat(conv)
        assert tokens[a:b].tolist() == chat.ids and mask[a:b].astype(bool).tolist() == chat.mask

    bad = list(convs)
    bad[520] = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": 5}]
    with pytest.raises(ConfigError, match=r"sft example 520: message 1 \(assistant\): content must be str"):
        build_sft_cache(bad, str(tmp_path / "sft"), tokenizer=tok, val_frac=0.0, seed=0)
    assert not (tmp_path / "sft").exists()


PLAIN = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.mark.parametrize("config", [None, {"eos_token": "<|endoftext|>"}])
def test_a_chat_template_jinja_beside_the_model_renders_chats(tmp_path, bpe_json, config):
    """transformers saves the template as chat_template.jinja; it is found with or without a tokenizer_config.json,
    and meta.json's tokenizer record names it (a changed template is a changed tokenizer)."""
    (tmp_path / "tokenizer.json").write_bytes(bpe_json.read_bytes())
    if config is not None:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "chat_template.jinja").write_text(PLAIN)
    tok = load_tokenizer(tmp_path)
    assert tok.chat_template == PLAIN
    chat = tok.render_chat(CONV[1:3])
    assert tok.decode(chat.ids, skip_special_tokens=False).startswith("<|im_start|>user\nName a colour.")
    assert trained_text(tok, chat) and trained_text(tok, chat)[0].startswith("Blue.")
    build_sft_cache([CONV[1:3]], str(tmp_path / "sft"), tokenizer=tok, val_frac=0.0, seed=0)
    first = read_meta(str(tmp_path / "sft"))["tokenizer"]["chat_template_sha256"]
    (tmp_path / "chat_template.jinja").write_text(PLAIN.replace("\n{{ m['content'] }}", ": {{ m['content'] }}"))
    assert load_tokenizer(tmp_path).describe()["chat_template_sha256"] not in (None, first)


def test_a_chat_template_jinja_that_is_not_utf8_is_refused(tmp_path, bpe_json):
    (tmp_path / "tokenizer.json").write_bytes(bpe_json.read_bytes())
    (tmp_path / "chat_template.jinja").write_bytes(b"{{ messages }}\xff\xfe")
    with pytest.raises(TokenizerError, match=r"chat_template.jinja: not UTF-8 .*save the template as UTF-8"):
        load_tokenizer(tmp_path)



# Granite 3.x's system turn when none is given (its tokens as ChatML), and Llama 3.2's date with its fallback
GRANITE = ("{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}"
           "{%- set loop_messages = messages[1:] %}{%- else %}{%- set system_message = \"Knowledge Cutoff Date: "
           "April 2024.\\nToday's Date: \" + strftime_now('%B %d, %Y') + \".\\nYou are Granite, developed by IBM.\" %}"
           "{%- set loop_messages = messages %}{%- endif %}<|im_start|>system\n{{ system_message }}<|im_end|>\n"
           "{% for m in loop_messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
           "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
LLAMA_DATE = ("{%- if not date_string is defined %}\n    {%- if strftime_now is defined %}\n        {%- set date_string "
              "= strftime_now(\"%d %b %Y\") %}\n    {%- else %}\n        {%- set date_string = \"26 Jul 2024\" %}\n"
              "    {%- endif %}\n{%- endif %}\n<|im_start|>system\nToday Date: {{ date_string }}<|im_end|>\n")


def _with_template(d, bpe_json, template: str):
    d.mkdir(exist_ok=True)
    (d / "tokenizer.json").write_bytes(bpe_json.read_bytes())
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "chat_template": template}))
    return load_tokenizer(d)


def test_a_template_that_writes_todays_date_renders_a_fixed_one_recorded_in_meta(tmp_path, bpe_json, hf_dir):
    """strftime_now, as transformers gives it, but of a fixed date: the cache is the same on any day."""
    tok = _with_template(tmp_path / "granite", bpe_json, GRANITE)
    chat = tok.render_chat(CONV[1:3])
    assert tok.decode(chat.ids, skip_special_tokens=False).startswith(
        "<|im_start|>system\nKnowledge Cutoff Date: April 2024.\nToday's Date: July 26, 2024.\nYou are Granite")
    assert trained_text(tok, chat) == ["Blue.<|im_end|>\n"]
    build_sft_cache([CONV[1:3]], str(tmp_path / "sft"), tokenizer=tok, val_frac=0.0, seed=0)
    assert read_meta(str(tmp_path / "sft"))["tokenizer"]["chat_template_date"] == "2024-07-26"
    assert "chat_template_date" not in load_tokenizer(hf_dir).describe()  # its template writes no date
    # the date a Llama 3.x template falls back to without strftime_now: its renderings are as they were
    llama = _with_template(tmp_path / "llama", bpe_json, LLAMA_DATE + CHATML)
    assert llama.decode(llama.render_chat(CONV[1:3]).ids, skip_special_tokens=False).startswith(
        "<|im_start|>system\nToday Date: 26 Jul 2024<|im_end|>\n<|im_start|>user\nName a colour.")
