"""oasst1 on data no other test has seen: every message left out of a kept tree is counted by reason (a
cycle inside a rooted tree included), a stream with no usable conversation says what was skipped and why,
a lone surrogate names its record, and the nested export given as flat data files is read as what it is."""

from __future__ import annotations

import json

import pytest

from niels_gpt.errors import ConfigError, SourceError
from niels_gpt.sources import oasst1
from niels_gpt.sources.oasst import SKIP_REASONS

from .test_chat_sources import TREE1, TREE2, TREE3, TREE4, flat, nested

TREE_LEVEL = {"deleted_root", "empty_root", "no_root", "lang", "no_assistant_turn"}


def _row(mid, parent, role, text="some text", **kw):
    return {"message_id": mid, "parent_id": parent, "message_tree_id": "t", "role": role, "text": text,
            "rank": kw.get("rank", 0.0), "deleted": kw.get("deleted", False), "lang": "en"}


def test_a_cycle_inside_a_rooted_tree_is_counted(tmp_path, write_jsonl):
    rows = [_row("r", None, "prompter"), _row("a", "r", "assistant"),
            _row("c1", "c2", "prompter"), _row("c2", "c1", "assistant")]  # a loop no path from r reaches
    src = oasst1(data_files=write_jsonl(tmp_path / "r.jsonl", rows))
    assert [[m["content"] for m in c] for c in src.iter_conversations()] == [["some text", "some text"]]
    assert src.skipped == {"cycle_message": 2}
    assert src.describe()["skipped"] == {"cycle_message": 2}


def test_every_message_of_a_kept_tree_is_in_its_conversation_or_counted_once(tmp_path, write_jsonl):
    extra = [_row("o", "nowhere", "assistant"), _row("o2", "o", "prompter"),  # an orphan and its reply
             _row("r5", None, "prompter", rank=None), _row("r5a", "r5", "assistant")]  # a second first prompt
    for tree in (TREE1, TREE4):
        rows = flat([tree])
        if tree is TREE4:
            rows += [{**r, "message_tree_id": "r4"} for r in extra]
        src = oasst1(data_files=write_jsonl(tmp_path / f"{tree['message_id']}.jsonl", rows))
        (conv,) = list(src.iter_conversations())
        counted = sum(n for reason, n in src.skipped.items() if reason not in TREE_LEVEL)
        assert len(conv) + counted == len(rows), (src.skipped, len(rows))
        assert set(src.skipped) <= set(SKIP_REASONS)
    assert src.skipped == {"empty_message": 1, "trailing_user_turn": 1, "orphan_message": 1,
                           "below_orphan_message": 1, "other_root_message": 2}


def test_no_usable_conversation_says_what_was_skipped_and_why(tmp_path, write_jsonl):
    f = write_jsonl(tmp_path / "t.jsonl", nested([TREE2, TREE3]))
    with pytest.raises(SourceError, match=r"no usable conversation in 2 tree\(s\), skipped: 2 deleted_message "
                                          r"\(deleted messages\); 1 deleted_root \(trees whose first prompt was "
                                          r"deleted\); 1 no_assistant_turn \(trees whose best path has no assistant"):
        list(oasst1(trees_jsonl=f).iter_conversations())
    alone = write_jsonl(tmp_path / "q.jsonl", nested([{**TREE4, "replies": []}]))
    with pytest.raises(SourceError, match=r"q.jsonl.*1 tree\(s\), skipped: 1 no_assistant_turn \(.*a prompt nobody"):
        list(oasst1(trees_jsonl=alone).iter_conversations())


def test_a_lone_surrogate_names_the_record_and_message(tmp_path):
    tree = {"message_id": "r", "role": "prompter", "text": "fine", "replies": [
        {"message_id": "bad", "role": "assistant", "text": "half \ud800 a pair", "replies": []}]}
    f = tmp_path / "t.jsonl"
    f.write_text(json.dumps({"message_id": "ok", "role": "prompter", "text": "q", "replies": [
        {"message_id": "ok-a", "role": "assistant", "text": "a", "replies": []}]}) + "\n" + json.dumps(tree) + "\n")
    with pytest.raises(SourceError, match=r"t.jsonl, line 2: message bad holds a lone surrogate escape "
                                          r"\('\\ud800' at character 5\)"):
        list(oasst1(trees_jsonl=f).iter_conversations())
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(_row("r", None, "prompter", "pair \udc00 half")) + "\n")
    with pytest.raises(SourceError, match=r"rows.jsonl, line 1: a lone surrogate escape \('\\udc00'\)"):
        list(oasst1(data_files=rows).iter_conversations())


def test_the_nested_export_given_as_data_files_is_read_as_trees(tmp_path, write_jsonl):
    for name, trees in (("roots.jsonl", [TREE1, TREE4]), ("release.jsonl", nested([TREE1, TREE4]))):
        src = oasst1(data_files=write_jsonl(tmp_path / name, trees))
        assert len(list(src.iter_conversations())) == 2
        assert src.describe()["layout"] == "nested-tree JSONL (recognised in data_files)"
    flat_file = write_jsonl(tmp_path / "flat.jsonl", flat([TREE4]))
    with pytest.raises(ConfigError, match=r"roots.jsonl'\] hold nested trees .* and \[.*flat.jsonl'\] flat message "
                                          r"rows; pass the nested ones as --oasst-trees-jsonl"):
        oasst1(data_files=[tmp_path / "roots.jsonl", flat_file])
