"""OpenAI's chat format in `messages` records: content-part lists and tool turns.

Text parts are joined with a newline (sources/messages.py); a non-text part (an image, audio) is a bad record
naming the record, the message and the part's type. Tool calls and tool results go to a tokenizer's own chat
template, which renders them; only assistant turns (tool calls included) are trained. The library's own renderer
has no tool turns: it refuses such a conversation in one line, or skips and counts it (`tool_turn`).
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from niels_gpt.cache.cli import main
from niels_gpt.cache.meta import read_meta
from niels_gpt.errors import ConfigError, SourceError
from niels_gpt.sources.documents import Rules, Skipped, detect, items
from niels_gpt.tokenizer import load_tokenizer

pytest.importorskip("tokenizers")

from ..tokenizer_backends.conftest import bpe_json, hf_dir  # noqa: E402, F401  (shared fixtures)

PARTS = [{"messages": [
    {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
    {"role": "user", "content": [{"type": "text", "text": f"What is {i}+{i}?"}, {"type": "text", "text": "Say it."}]},
    {"role": "assistant", "content": [{"type": "text", "text": f"It is {2 * i}."}]}]} for i in range(4)]
IMAGE = {"messages": [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                                    {"type": "image_url", "image_url": {"url": "x.png"}}]},
                      {"role": "assistant", "content": "A cat."}]}
CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 2}"}}
TOOLS = {"messages": [{"role": "user", "content": "What is 2+2?"},
                      {"role": "assistant", "content": None, "tool_calls": [CALL]},
                      {"role": "tool", "tool_call_id": "c1", "name": "add", "content": "4"},
                      {"role": "assistant", "content": "It is 4."}]}
# ChatML that writes tool calls as <tool_call>JSON</tool_call> and tool results as a `tool` turn
TOOLS_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% for c in m.get('tool_calls') or [] %}<tool_call>{{ c['function'] | tojson }}</tool_call>{% endfor %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _trained(cache, tok) -> list[str]:
    """The trained text of each train example of a cache with a stored mask."""
    ids = np.fromfile(cache / "train_tokens.bin", dtype=tok.token_dtype)
    mask = np.fromfile(cache / "train_mask.bin", dtype=np.uint8)
    starts = [*np.load(cache / "train_idx.npy").tolist(), len(ids)]
    return [tok.decode(ids[a:b][mask[a:b] == 1].tolist(), skip_special_tokens=False)
            for a, b in zip(starts, starts[1:], strict=False)]


@pytest.fixture(scope="module")
def tools_dir(tmp_path_factory, bpe_json):  # noqa: F811
    d = tmp_path_factory.mktemp("tools") / "tools-tok"
    d.mkdir()
    shutil.copy(bpe_json, d / "tokenizer.json")
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "chat_template": TOOLS_TEMPLATE}))
    return d


def test_content_parts_are_detected_as_messages_and_their_text_parts_joined_with_a_newline():
    assert detect("r", PARTS[1], chat=True, rules=Rules()) == "messages"
    (conv,) = items([("r", PARTS[1])], "messages", Rules())
    assert conv == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 1+1?\nSay it."},
                    {"role": "assistant", "content": "It is 2."}]


def test_a_non_text_part_is_refused_naming_the_record_message_and_type_or_skipped_and_counted():
    with pytest.raises(SourceError, match=r"chats.jsonl, line 2: message 0 \(user\) has a 'image_url' content part "
                                          r"\(part 1\); only text parts can be trained.*--on-bad-record skip"):
        list(items([("chats.jsonl, line 1", PARTS[0]), ("chats.jsonl, line 2", IMAGE)], "messages", Rules()))
    out = list(items([("a", PARTS[0]), ("b", IMAGE)], "messages", Rules(on_bad_record="skip")))
    assert out[1] == Skipped("non_text_part") and out[0][2] == {"role": "assistant", "content": "It is 0."}


def test_tool_keys_are_kept_and_a_null_content_beside_tool_calls_is_empty():
    (conv,) = items([("r", TOOLS)], "messages", Rules())
    assert conv[1] == {"role": "assistant", "content": "", "tool_calls": [CALL]}
    assert conv[2] == {"role": "tool", "content": "4", "tool_call_id": "c1", "name": "add"}


@pytest.mark.parametrize("executor", ["inline", "processes"])
def test_content_parts_build_with_chat_and_train_the_assistant_text(tmp_path, hf_dir, executor):  # noqa: F811
    src = _jsonl(tmp_path / "parts.jsonl", [*PARTS, IMAGE])
    argv = ["build", str(src), "--chat", "--out", str(tmp_path / "s"), "--tokenizer", str(hf_dir), "--no-progress",
            "--on-bad-record", "skip", "--executor", executor, "--workers", "2"]
    assert main(argv) == 0
    meta = read_meta(str(tmp_path / "s"))
    assert meta["totals"]["train_examples"] == 4 and meta["skipped"]["non_text_part"] == 1
    assert _trained(tmp_path / "s", load_tokenizer(hf_dir)) == [f"It is {2 * i}.<|im_end|>\n" for i in range(4)]


def test_a_template_that_knows_tools_renders_them_and_only_assistant_turns_are_trained(tmp_path, tools_dir):
    tok = load_tokenizer(tools_dir)
    assert main(["build", str(_jsonl(tmp_path / "t.jsonl", [TOOLS])), "--chat", "--out", str(tmp_path / "s"),
                 "--tokenizer", str(tools_dir), "--no-progress"]) == 0
    ids = np.fromfile(tmp_path / "s" / "train_tokens.bin", dtype=tok.token_dtype).tolist()
    text = tok.decode(ids, skip_special_tokens=False)
    assert "<|im_start|>tool\n4<|im_end|>" in text  # the tool's result, as the template writes it
    call = '<tool_call>{"name": "add", "arguments": "{\\"a\\": 2, \\"b\\": 2}"}</tool_call>'
    assert _trained(tmp_path / "s", tok) == [f"{call}<|im_end|>\nIt is 4.<|im_end|>\n"]  # never the tool's result


@pytest.mark.parametrize("executor", ["inline", "processes"])
def test_the_librarys_renderer_refuses_tool_turns_in_one_line_or_skips_and_counts_them(tmp_path, tokenizer,
                                                                                      executor, capsys):
    src = _jsonl(tmp_path / "t.jsonl", [TOOLS, {"messages": [{"role": "user", "content": "hi"},
                                                             {"role": "assistant", "content": "hello"}]}])
    argv = ["build", str(src), "--chat", "--out", str(tmp_path / "s"), "--tokenizer", tokenizer.model_path,
            "--no-progress", "--executor", executor, "--workers", "2"]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: ") and "example 0" in err and "tool call or a tool result" in err
    assert "--chat-template FILE" in err and "--on-bad-record skip" in err
    assert not (tmp_path / "s").exists()
    assert main([*argv, "--on-bad-record", "skip"]) == 0
    meta = read_meta(str(tmp_path / "s"))
    assert meta["skipped"]["tool_turn"] == 1 and meta["totals"]["train_examples"] == 1


def test_the_python_builder_refuses_tool_turns_with_the_librarys_renderer(tmp_path, tokenizer):
    from niels_gpt.builders.sft import build_sft_cache

    (conv,) = items([("r", TOOLS)], "messages", Rules())
    with pytest.raises(ConfigError, match=r"example 0: the conversation holds a tool call"):
        build_sft_cache([conv], str(tmp_path / "s"), tokenizer=tokenizer, val_frac=0.0, seed=0)
