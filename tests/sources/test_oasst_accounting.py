"""oasst1 on data no other test has seen: every message left out of a kept tree is counted by reason (a
cycle inside a rooted tree included), a build with no usable conversation says what was skipped and why,
a lone surrogate names its record, and the nested export given as flat data files is read as what it is."""

from __future__ import annotations

import gzip
import json

import pytest

from niels_gpt.builders.run import BuildSpec, build
from niels_gpt.errors import ConfigError, SourceError
from niels_gpt.sources.named import inputs
from niels_gpt.sources.oasst_trees import SKIP_REASONS, holds_nested_trees

from .test_chat_sources import TREE1, TREE2, TREE3, TREE4, flat, nested, oasst1

TREE_LEVEL = {"deleted_root", "empty_root", "no_root", "lang", "no_assistant_turn"}


def _row(mid, parent, role, text="some text", **kw):
    return {"message_id": mid, "parent_id": parent, "message_tree_id": "t", "role": role, "text": text,
            "rank": kw.get("rank", 0.0), "deleted": kw.get("deleted", False), "lang": "en"}


def test_a_cycle_inside_a_rooted_tree_is_counted(tmp_path, write_jsonl):
    rows = [_row("r", None, "prompter"), _row("a", "r", "assistant"),
            _row("c1", "c2", "prompter"), _row("c2", "c1", "assistant")]  # a loop no path from r reaches
    src = oasst1(write_jsonl(tmp_path / "r.jsonl", rows))
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
        src = oasst1(write_jsonl(tmp_path / f"{tree['message_id']}.jsonl", rows))
        (conv,) = list(src.iter_conversations())
        counted = sum(n for reason, n in src.skipped.items() if reason not in TREE_LEVEL)
        assert len(conv) + counted == len(rows), (src.skipped, len(rows))
        assert set(src.skipped) <= set(SKIP_REASONS)
    assert src.skipped == {"empty_message": 1, "trailing_user_turn": 1, "orphan_message": 1,
                           "below_orphan_message": 1, "other_root_message": 2}


def test_no_usable_conversation_says_what_was_skipped_and_why(tmp_path, write_jsonl, tokenizer):
    f = write_jsonl(tmp_path / "t.jsonl", nested([TREE2, TREE3]))
    spec = BuildSpec(sources=[str(f)], out=str(tmp_path / "c"), tokenizer=tokenizer, chat=True, layout="oasst")
    with pytest.raises(ConfigError, match=r"no usable conversation for .*t.jsonl: every record was skipped \(by "
                                          r"reason: deleted_message 2, deleted_root 1, no_assistant_turn 1\)"):
        build(spec)
    assert not (tmp_path / "c").exists()


def test_a_lone_surrogate_names_the_record(tmp_path):
    tree = {"message_id": "r", "role": "prompter", "text": "fine", "replies": [
        {"message_id": "bad", "role": "assistant", "text": "half \ud800 a pair", "replies": []}]}
    f = tmp_path / "t.jsonl"
    f.write_text(json.dumps({"message_id": "ok", "role": "prompter", "text": "q", "replies": [
        {"message_id": "ok-a", "role": "assistant", "text": "a", "replies": []}]}) + "\n" + json.dumps(tree) + "\n")
    with pytest.raises(SourceError, match=r"t.jsonl, line 2: a lone surrogate escape \('\\ud800'\)"):
        list(oasst1(f).iter_conversations())
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(_row("r", None, "prompter", "pair \udc00 half")) + "\n")
    with pytest.raises(SourceError, match=r"rows.jsonl, line 1: a lone surrogate escape \('\\udc00'\)"):
        list(oasst1(rows).iter_conversations())


def test_the_nested_export_given_as_data_files_is_read_as_trees(tmp_path, write_jsonl):
    for name, trees in (("roots.jsonl", [TREE1, TREE4]), ("release.jsonl", nested([TREE1, TREE4]))):
        spec = inputs("oasst1", {"oasst_data_files": [str(write_jsonl(tmp_path / name, trees))]}, seed=42)
        assert len(list(oasst1(*spec["sources"], layout=spec["layout"]).iter_conversations())) == 2
    flat_file = write_jsonl(tmp_path / "flat.jsonl", flat([TREE4]))
    assert len(list(oasst1(flat_file).iter_conversations())) == 1  # flat rows under the same layout
    with pytest.raises(ConfigError, match=r"roots.jsonl', .*flat.jsonl'\] mix nested trees .* and flat message "
                                          r"rows; pass the nested ones as --oasst-trees-jsonl"):
        inputs("oasst1", {"oasst_data_files": [str(tmp_path / "roots.jsonl"), str(flat_file)]}, seed=42)


def _compressed(path, rows: list[dict]):
    """JSON Lines of `rows`, gzip- or zstd-compressed by the name's suffix."""
    import zstandard

    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    path.write_bytes(zstandard.ZstdCompressor().compress(data) if path.name.endswith(".zst") else gzip.compress(data))
    return path


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".json.gz", ".jsonl.zst", ".json.zst"])
def test_a_compressed_nested_export_is_told_from_flat_rows_as_the_plain_file_is(tmp_path, write_jsonl, suffix):
    trees = _compressed(tmp_path / f"trees{suffix}", nested([TREE1, TREE4]))
    rows = _compressed(tmp_path / f"rows{suffix}", flat([TREE4]))
    assert holds_nested_trees(trees) and not holds_nested_trees(rows)
    spec = inputs("oasst1", {"oasst_data_files": [str(trees)]}, seed=42)
    plain = write_jsonl(tmp_path / "trees.jsonl", nested([TREE1, TREE4]))
    assert list(oasst1(*spec["sources"], layout=spec["layout"]).iter_conversations()) == \
        list(oasst1(plain).iter_conversations())
    flat_file = write_jsonl(tmp_path / "flat.jsonl", flat([TREE4]))
    with pytest.raises(ConfigError, match=rf"trees{suffix}', .*flat.jsonl'\] mix nested trees .* and flat message rows"):
        inputs("oasst1", {"oasst_data_files": [str(trees), str(flat_file)]}, seed=42)


def test_a_row_holding_a_lone_surrogate_names_the_record_and_message():
    from niels_gpt.sources.oasst_trees import check_row

    check_row(_row("ok", None, "prompter", "fine"), "rows, record 0")
    with pytest.raises(SourceError, match=r"rows, record 1: message bad holds a lone surrogate escape \('\\ud800' at "
                                          r"character 5\)"):
        check_row(_row("bad", None, "prompter", "half \ud800 a pair"), "rows, record 1")
