"""ShareGPT (`conversations: [{from, value}]`) and Alpaca (`instruction`, `input`, `output`) records are detected
chat layouts: built with --chat, the assistant turns are what is trained on."""

from __future__ import annotations

import json

import numpy as np
import pytest

from niels_gpt.cache.cli import main
from niels_gpt.cache.meta import read_meta
from niels_gpt.cache.sft_dataset import SFTExampleDataset
from niels_gpt.errors import ConfigError
from niels_gpt.sources.documents import Rules, detect, items
from niels_gpt.tokenizer import load_tokenizer

pytest.importorskip("tokenizers")

SHAREGPT = [{"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": f"What is {i}+{i}?"},
                               {"from": "gpt", "value": f"It is {2 * i}."}]} for i in range(4)]
ALPACA = [{"instruction": f"Add {i} and {i}.", "input": "" if i % 2 else f"Show the sum of {i}.", "output": f"{2 * i}"}
          for i in range(4)]


@pytest.mark.parametrize(("record", "layout"), [
    (SHAREGPT[0], "sharegpt"),
    ({"messages": SHAREGPT[0]["conversations"]}, "sharegpt"),  # ShareGPT turns under the messages field
    (ALPACA[0], "alpaca"),
    ({"messages": [{"role": "user", "content": "hi"}]}, "messages"),
    ({"instruction": "x", "context": "", "response": "y"}, "dolly"),
])
def test_chat_layouts_are_detected_from_the_first_record(record, layout):
    assert detect("r", record, chat=True, rules=Rules()) == layout


def test_sharegpt_and_alpaca_records_become_role_content_conversations():
    (conv,) = items([("r", SHAREGPT[1])], "sharegpt", Rules())
    assert conv == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 1+1?"},
                    {"role": "assistant", "content": "It is 2."}]
    first, second = items([("a", ALPACA[0]), ("b", ALPACA[1])], "alpaca", Rules())
    assert first == [{"role": "user", "content": "Add 0 and 0.\n\nShow the sum of 0."},
                     {"role": "assistant", "content": "0"}]
    assert second == [{"role": "user", "content": "Add 1 and 1."}, {"role": "assistant", "content": "2"}]


@pytest.mark.parametrize(("rows", "answers"), [(SHAREGPT, [f"It is {2 * i}." for i in range(4)]),
                                               (ALPACA, [f"{2 * i}" for i in range(4)])])
def test_a_detected_chat_layout_builds_with_chat_and_trains_on_the_assistant_turns(tmp_path, hf_dir, rows, answers):
    tok = load_tokenizer(hf_dir)
    (tmp_path / "chats.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["build", str(tmp_path / "chats.jsonl"), "--chat", "--out", str(tmp_path / "s"), "--tokenizer",
                 str(hf_dir), "--no-progress"]) == 0
    meta = read_meta(str(tmp_path / "s"))
    assert meta["kind"] == "sft" and meta["totals"]["train_examples"] == len(rows)
    ds = SFTExampleDataset(str(tmp_path / "s" / "train_tokens.bin"), str(tmp_path / "s" / "train_idx.npy"),
                           T=256, device="cpu", eot_id=tok.eot_id)
    for i, answer in enumerate(answers):
        _, _, ym = ds.collate(np.array([i]))
        trained = [t for t in ym[0].tolist() if t != -100]
        assert tok.decode(trained, skip_special_tokens=False) == answer + "<|im_end|>\n"


def test_sharegpt_read_as_messages_ends_naming_the_counted_reason_and_the_layout_to_use(tmp_path, hf_dir, capsys):
    (tmp_path / "chats.jsonl").write_text("".join(json.dumps(r) + "\n" for r in SHAREGPT))
    argv = ["build", str(tmp_path / "chats.jsonl"), "--chat", "--format", "messages", "--messages-field",
            "conversations", "--on-bad-record", "skip", "--out", str(tmp_path / "s"), "--tokenizer", str(hf_dir),
            "--no-progress"]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "bad_messages 4" in err and "--format" in err and "sharegpt" in err
    assert "lacked an assistant turn" not in err
    assert not (tmp_path / "s" / "meta.json").exists()


def test_the_python_builder_says_the_same(tmp_path, tokenizer):
    from niels_gpt.builders.sft import build_sft_cache

    with pytest.raises(ConfigError, match=r"every record was skipped \(by reason: none\)"):
        build_sft_cache([], str(tmp_path / "s"), tokenizer=tokenizer, val_frac=0.0, seed=0)


def _written_on_windows(value):
    """`value` with every line break of its strings written as CRLF (an editor or export on Windows)."""
    if isinstance(value, str):
        return value.replace("\n", "\r\n")
    if isinstance(value, list):
        return [_written_on_windows(v) for v in value]
    if isinstance(value, dict):
        return {k: _written_on_windows(v) for k, v in value.items()}
    return value


def _oasst_row(mid, parent, role, text):
    return {"message_id": mid, "parent_id": parent, "message_tree_id": "t", "role": role, "text": text}


# one record per chat layout, its message texts holding line breaks
CHAT_RECORDS = [
    ("messages", [{"messages": [{"role": "system", "content": "Be brief.\nAnswer plainly."},
                                {"role": "user", "content": [{"type": "text", "text": "Line one\nline two"},
                                                             {"type": "text", "text": "part two"}]},
                                {"role": "assistant", "content": "First.\nSecond.\n"}]}]),
    ("sharegpt", [{"conversations": [{"from": "human", "value": "Two\nlines"}, {"from": "gpt", "value": "A\nB"}]}]),
    ("columns", [{"q": "Two\nlines", "a": "A\nB"}]),
    ("dolly", [{"instruction": "Sum up\nthis.", "context": "One.\nTwo.", "response": "Both\nsaid."}]),
    ("alpaca", [{"instruction": "Sum up\nthis.", "input": "", "output": "Both\nsaid."}]),
    ("oasst", [{"message_tree_id": "t", "prompt": {"message_id": "p", "role": "prompter", "text": "Two\nlines",
                                                   "replies": [{"message_id": "r", "role": "assistant",
                                                                "text": "A\nB", "replies": []}]}}]),
    ("oasst-rows", [_oasst_row("p", None, "prompter", "Two\nlines"), _oasst_row("r", "p", "assistant", "A\nB")]),
]


@pytest.mark.parametrize(("layout", "rows"), CHAT_RECORDS, ids=[c[0] for c in CHAT_RECORDS])
def test_message_contents_follow_the_text_rules_in_every_chat_layout(layout, rows):
    """A conversation written on Windows (CRLF, a BOM) reads as the same conversation written with LF."""
    rules = Rules(chat_columns=("q", "a") if layout == "columns" else None)
    plain = list(items([(f"r{i}", r) for i, r in enumerate(rows)], layout, rules))
    windows = _written_on_windows(rows)
    first = windows[0].get("messages", [None])[0]
    if layout == "messages":  # a BOM and a lone CR too
        first["content"] = "\ufeff" + first["content"].replace("\r\n", "\r")
    read = list(items([(f"r{i}", r) for i, r in enumerate(windows)], layout, rules))
    assert read == plain
    assert len(plain) == 1 and any("\n" in m["content"] for m in plain[0])


def test_a_chat_file_written_on_windows_builds_the_same_tokens(tmp_path, hf_dir):
    rows = [{"messages": [{"role": "user", "content": f"Question {i}:\nwhat is {i}+{i}?"},
                          {"role": "assistant", "content": f"It is\n{2 * i}."}]} for i in range(4)]
    for name, data in (("unix", rows), ("windows", _written_on_windows(rows))):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
        assert main(["build", str(tmp_path / f"{name}.jsonl"), "--chat", "--out", str(tmp_path / name),
                     "--tokenizer", str(hf_dir), "--val-frac", "0", "--no-progress"]) == 0
    assert "\\r\\n" in (tmp_path / "windows.jsonl").read_text()
    assert (tmp_path / "windows" / "train_tokens.bin").read_bytes() == (tmp_path / "unix" / "train_tokens.bin").read_bytes()
