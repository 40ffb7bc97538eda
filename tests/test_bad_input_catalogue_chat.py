"""The bad-input catalogue for chat formats (OpenAI content parts that are not text, tool turns where the
tokenizer cannot render them) and the per-input val split.

Each case is held to the catalogue's promises (tests/test_bad_input_catalogue.py: one `error:` line naming the
file, flag or record, no complete-looking output, every input unchanged).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .test_bad_input_catalogue import Case, check_case, world  # noqa: F401  (the shared fixture)

ANSWER = {"role": "assistant", "content": "A cat."}


def _chats(tmp: Path, *rows: dict) -> Path:
    path = tmp / "chats.jsonl"
    ok = {"messages": [{"role": "user", "content": "Hello?"}, {"role": "assistant", "content": "Hello."}]}
    path.write_text("".join(json.dumps(r) + "\n" for r in (ok, *rows)))
    return path


def _build(w, tmp, src: Path, *extra: str) -> list[str]:
    return ["build", str(src), "--chat", "--out", str(tmp / "out"), "--tokenizer", str(w.tokenizer), "--no-progress",
            *extra]


def build_chat_an_image_content_part(w, tmp):
    image = {"messages": [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                                        {"type": "image_url", "image_url": {"url": "cat.png"}}]}, ANSWER]}
    return _build(w, tmp, _chats(tmp, image))


def build_chat_an_audio_part_among_parts(w, tmp):
    audio = {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AAAA"}}]},
                          ANSWER]}
    return _build(w, tmp, _chats(tmp, audio), "--executor", "processes", "--workers", "2")


def build_chat_a_content_part_without_a_type(w, tmp):
    return _build(w, tmp, _chats(tmp, {"messages": [{"role": "user", "content": [{"text": "hi"}]}, ANSWER]}))


def build_chat_tool_turns_with_the_librarys_tokenizer(w, tmp):
    call = {"id": "c1", "type": "function", "function": {"name": "look", "arguments": "{}"}}
    tools = {"messages": [{"role": "user", "content": "What is this?"},
                          {"role": "assistant", "content": None, "tool_calls": [call]},
                          {"role": "tool", "tool_call_id": "c1", "content": "a cat"}, ANSWER]}
    return _build(w, tmp, _chats(tmp, tools))


def build_chat_tool_calls_that_are_not_a_list(w, tmp):
    bad = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "", "tool_calls": "look"}]}
    return _build(w, tmp, _chats(tmp, bad))


def build_val_per_input_without_val_frac(w, tmp):
    (tmp / "book.txt").write_text("A first paragraph.\n\nA second one.\n")
    return ["build", str(tmp / "book.txt"), "--out", str(tmp / "out"), "--tokenizer", str(w.tokenizer),
            "--no-progress", "--val-per-input"]


def build_chat_val_per_input(w, tmp):
    return _build(w, tmp, _chats(tmp), "--val-frac", "0.1", "--val-per-input")


CASES = [
    Case("build --chat: an image content part", build_chat_an_image_content_part,
         ("chats.jsonl, line 2", "message 0 (user)", "'image_url' content part", "--on-bad-record skip"), out="out"),
    Case("build --chat --executor processes: an audio content part", build_chat_an_audio_part_among_parts,
         ("chats.jsonl", "line 2", "'input_audio' content part", "only text parts"), out="out"),
    Case("build --chat: a content part without a type", build_chat_a_content_part_without_a_type,
         ("chats.jsonl, line 2", "content part 0", "\"type\": \"text\""), out="out"),
    Case("build --chat: tool turns with the library's tokenizer", build_chat_tool_turns_with_the_librarys_tokenizer,
         ("example 1", "tool call or a tool result", "--chat-template FILE", "--on-bad-record skip"), out="out"),
    Case("build --chat: tool_calls that are not a list", build_chat_tool_calls_that_are_not_a_list,
         ("chats.jsonl, line 2", "message 1 (assistant)", "tool_calls is str"), out="out"),
    Case("build: --val-per-input without --val-frac", build_val_per_input_without_val_frac,
         ("--val-per-input", "give --val-frac"), out="out"),
    Case("build --chat: --val-per-input", build_chat_val_per_input,
         ("--val-per-input", "split by conversation", "drop --val-per-input"), out="out"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_chat_input_gets_one_clear_line_and_nothing_lost(case, world, tmp_path, capsys):  # noqa: F811
    check_case(case, world, tmp_path, capsys)
