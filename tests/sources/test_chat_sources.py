"""dolly15k and oasst1 through the input layer (layouts dolly, oasst): conversation layout, best-path selection,
skips and rejections."""

from __future__ import annotations

import json

import pytest

from niels_gpt.errors import ConfigError, SourceError
from niels_gpt.sources.corpus import corpus
from niels_gpt.sources.named import inputs
from niels_gpt.sources.oasst_trees import best_path

DOLLY = [
    {"instruction": "When did X start?", "context": "X started in 2000.", "response": "In 2000.",
     "category": "closed_qa"},
    {"instruction": " Name a fish. ", "context": "", "response": "Tope.\n", "category": "classification"},
    {"instruction": "Say nothing", "context": "", "response": "   ", "category": "open_qa"},
    {"instruction": "", "context": "ctx", "response": "r", "category": "open_qa"},
]


def dolly15k(*files, **kw):
    return corpus(list(files), layout="dolly", chat=True, **kw)


def oasst1(*files, layout="oasst", **kw):
    return corpus(list(files), layout=layout, chat=True, **kw)


def hub(monkeypatch, tmp_path, parts):
    """`datasets.load_dataset` answered, per split, by a local JSON Lines file read through `datasets`."""
    import datasets

    real, calls = datasets.load_dataset, []
    for split, rows in parts.items():
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    def fake(path, **kw):
        calls.append((path, kw))
        return real("json", data_files=[str(tmp_path / f"{kw['split']}.jsonl")], split="train", streaming=True)

    monkeypatch.setattr(datasets, "load_dataset", fake)
    return calls


def u(text):
    return {"role": "user", "content": text}


def a(text):
    return {"role": "assistant", "content": text}


def test_dolly_layout_with_and_without_context(tmp_path, write_jsonl):
    src = dolly15k(write_jsonl(tmp_path / "d.jsonl", DOLLY))
    assert list(src.iter_conversations()) == [
        [u("When did X start?\n\nContext:\nX started in 2000."), a("In 2000.")],
        [u("Name a fish."), a("Tope.")],
    ]
    assert src.skipped == {"no_assistant_turn": 1, "empty_user_turn": 1}
    assert json.loads(json.dumps(src.describe()))["skipped"] == {"empty_user_turn": 1, "no_assistant_turn": 1}


def test_dolly_hub_path(monkeypatch, tmp_path):
    calls = hub(monkeypatch, tmp_path, {"train": DOLLY[1:2]})
    spec = inputs("dolly15k", {}, seed=42)
    assert (spec["sources"], spec["layout"], spec["chat"]) == (["databricks/databricks-dolly-15k"], "dolly", True)
    assert list(dolly15k(*spec["sources"]).iter_conversations()) == [[u("Name a fish."), a("Tope.")]]
    assert calls and all(c == ("databricks/databricks-dolly-15k", {"streaming": True, "name": None, "split": "train"})
                         for c in calls)


def test_dolly_rejects_record_without_response_field(tmp_path, write_jsonl):
    f = write_jsonl(tmp_path / "d.jsonl", [{"instruction": "q", "context": "", "answer": "x"}])
    with pytest.raises(SourceError, match=r"d.jsonl, line 1: field 'response' is missing.*--on-bad-record skip"):
        list(dolly15k(f).iter_conversations())


@pytest.mark.parametrize("layout, good, broken", [
    ("dolly", DOLLY[1], [{"instruction": "q", "context": "", "answer": "x"},
                         {"instruction": "q", "context": "", "response": 7}]),
    ("alpaca", {"instruction": "q", "output": "a"}, [{"instruction": "q", "answer": "x"},
                                                     {"instruction": "q", "output": 7}]),
])
def test_instruction_layouts_skip_and_count_bad_records_alike(tmp_path, write_jsonl, layout, good, broken):
    # a record missing a field, or with a number where text belongs, is skipped and counted under
    # --on-bad-record skip in every instruction layout (dolly stopped the build on it)
    src = corpus([write_jsonl(tmp_path / "d.jsonl", [*broken, good])], layout=layout, chat=True, on_bad_record="skip")
    assert len(list(src.iter_conversations())) == 1
    assert src.skipped == {"missing_field": 1, "not_text": 1}


# --- oasst1 ------------------------------------------------------------------------------------

def msg(mid, role, text, *, rank=None, deleted=False, replies=()):
    return {"message_id": mid, "role": role, "text": text, "rank": rank, "deleted": deleted,
            "lang": "en", "replies": list(replies)}


# Tree 1: the tie between two rank-1 replies goes to the smaller message_id ("a-aaa"); the rank-0
# reply is deleted; two unranked prompter replies tie and "p-a" wins; then rank 0 beats rank 1.
TREE1 = msg("r1", "prompter", "Question one?", replies=[
    msg("a-one", "assistant", "Answer one.", rank=1),
    msg("a-del", "assistant", "Deleted best.", rank=0, deleted=True),
    msg("a-none", "assistant", "Unranked.", rank=None),
    msg("a-aaa", "assistant", "Answer aaa.", rank=1, replies=[
        msg("p-b", "prompter", "Follow-up b?"),
        msg("p-a", "prompter", "Follow-up a?", replies=[
            msg("x-1", "assistant", "Second best.", rank=1),
            msg("x-0", "assistant", "Best final.", rank=0),
        ]),
    ]),
])
TREE2 = msg("r2", "prompter", "Unanswered?", replies=[msg("d", "assistant", "gone", rank=0, deleted=True)])
TREE3 = msg("r3", "prompter", "Deleted root", deleted=True, replies=[msg("e", "assistant", "x", rank=0)])
TREE4 = msg("r4", "prompter", "Hi", replies=[
    msg("f", "assistant", "  ", rank=0),
    msg("g", "assistant", "Hello!", rank=1, replies=[msg("h", "prompter", "Thanks")]),
])
EXPECTED = [
    [u("Question one?"), a("Answer aaa."), u("Follow-up a?"), a("Best final.")],
    [u("Hi"), a("Hello!")],
]
EXPECTED_SKIPPED = {"deleted_message": 3, "no_assistant_turn": 1, "deleted_root": 1, "empty_message": 1,
                    "trailing_user_turn": 1, "unselected_message": 4}


def nested(trees):
    return [{"message_tree_id": t["message_id"], "tree_state": "ready_for_export", "prompt": t} for t in trees]


def flat(trees):
    rows = []
    for t in trees:
        stack = [(t, None)]
        while stack:
            m, parent = stack.pop()
            rows.append({**{k: v for k, v in m.items() if k != "replies"}, "parent_id": parent,
                         "message_tree_id": t["message_id"],
                         "rank": None if m["rank"] is None else float(m["rank"])})
            stack.extend((r, m["message_id"]) for r in m["replies"])
    return rows


def test_oasst_nested_trees_follow_best_ranked_replies(tmp_path, write_jsonl):
    src = oasst1(write_jsonl(tmp_path / "t.jsonl", nested([TREE1, TREE2, TREE3, TREE4])))
    assert list(src.iter_conversations()) == EXPECTED
    assert src.skipped == EXPECTED_SKIPPED


def test_oasst_flat_rows_give_the_same_conversations(tmp_path, write_parquet, write_jsonl):
    rows = flat([TREE1, TREE2, TREE3, TREE4])
    for f in (write_parquet(tmp_path / "r.parquet", rows), write_jsonl(tmp_path / "r.jsonl", rows)):
        src = oasst1(f)
        assert list(src.iter_conversations()) == EXPECTED
        assert src.skipped == EXPECTED_SKIPPED


def test_oasst_nan_rank_counts_as_unranked():
    rows = flat([TREE4])
    for r in rows:
        if r["message_id"] == "g":
            r["rank"] = float("nan")
    rows.append({**rows[-1], "message_id": "z", "parent_id": "r4", "text": "Ranked", "rank": 2.0})
    assert [r["message_id"] for r in best_path(rows, __import__("collections").Counter())] == ["r4", "z"]


def test_oasst_orphans_and_missing_root_are_counted(tmp_path, write_jsonl):
    rows = flat([TREE4]) + [{"message_id": "o", "parent_id": "nowhere", "message_tree_id": "r4",
                             "role": "assistant", "text": "orphan", "rank": 0.0, "deleted": False, "lang": "en"}]
    rows += [{"message_id": "q", "parent_id": "missing", "message_tree_id": "t9", "role": "assistant",
              "text": "x", "rank": 0.0, "deleted": False, "lang": "en"}]
    src = oasst1(write_jsonl(tmp_path / "r.jsonl", rows))
    assert list(src.iter_conversations()) == [[u("Hi"), a("Hello!")]]
    assert src.skipped == {"orphan_message": 2, "no_root": 1, "empty_message": 1, "trailing_user_turn": 1}


def test_oasst_hub_path_reads_train_then_validation(monkeypatch, tmp_path):
    calls = hub(monkeypatch, tmp_path, {"train+validation": flat([TREE4]) + flat([TREE1])})
    spec = inputs("oasst1", {}, seed=42)
    assert (spec["sources"], spec["layout"], spec["split"]) == (["OpenAssistant/oasst1"], "oasst", "train+validation")
    assert list(oasst1(*spec["sources"], split=spec["split"]).iter_conversations()) == [EXPECTED[1], EXPECTED[0]]
    assert calls and all(c == ("OpenAssistant/oasst1", {"streaming": True, "name": None, "split": "train+validation"})
                         for c in calls)


def test_oasst_rejections(tmp_path, write_jsonl):
    rows = flat([TREE4])
    bad_role = [dict(rows[0], role="moderator")] + rows[1:]
    with pytest.raises(SourceError, match=r"r.jsonl, line 1: unknown role 'moderator' in message r4"):
        list(oasst1(write_jsonl(tmp_path / "r.jsonl", bad_role)).iter_conversations())
    split_tree = rows[:1] + flat([TREE2]) + rows[1:]
    with pytest.raises(SourceError, match=r"s.jsonl, line 4: rows of tree r4 are not contiguous"):
        list(oasst1(write_jsonl(tmp_path / "s.jsonl", split_tree)).iter_conversations())
    no_id = [{k: v for k, v in rows[0].items() if k != "message_tree_id"}]
    with pytest.raises(SourceError, match=r"n.jsonl, line 1: no 'message_tree_id'"):
        list(oasst1(write_jsonl(tmp_path / "n.jsonl", no_id + rows[1:])).iter_conversations())
    with pytest.raises(ConfigError, match="pass --oasst-data-files .* or --oasst-trees-jsonl .*, not both"):
        inputs("oasst1", {"oasst_data_files": [str(tmp_path / "r.jsonl")], "oasst_trees_jsonl": str(tmp_path / "r.jsonl")},
               seed=42)
    with pytest.raises(SourceError, match=r"gone.jsonl: no such file or directory"):
        list(oasst1(tmp_path / "gone.jsonl").iter_conversations())


def test_oasst_nested_rejections_name_line_and_byte(tmp_path):
    good = json.dumps(nested([TREE4])[0])
    f = tmp_path / "t.jsonl"
    f.write_text(good + "\n{not json\n")
    with pytest.raises(SourceError, match=r"t.jsonl, line 2: not valid JSON"):
        list(oasst1(f).iter_conversations())
    f.write_bytes(good.encode() + b"\n" + b'{"x": "\xff"}\n')
    with pytest.raises(SourceError, match=rf"t.jsonl, line 2: not UTF-8 .*\(byte {len(good) + 8} of the file\)"):
        list(oasst1(f).iter_conversations())
    f.write_text('{"message_tree_id": "t", "messages": []}\n')
    with pytest.raises(SourceError, match=r"t.jsonl, line 1: not an oasst1 tree"):
        list(oasst1(f).iter_conversations())
    f.write_text(json.dumps(nested([msg("r", "system", "x")])[0]) + "\n")
    with pytest.raises(SourceError, match=r"t.jsonl, line 1: unknown role 'system' in message r"):
        list(oasst1(f).iter_conversations())


def test_oasst_pre_release_bare_root_lines_give_the_same_conversations(tmp_path, write_jsonl):
    # the pre-release export: each line is the root message itself, its replies nested under it
    bare = [TREE1, TREE2, TREE3, TREE4]
    src = oasst1(write_jsonl(tmp_path / "bare.jsonl", bare))
    assert list(src.iter_conversations()) == EXPECTED
    assert src.skipped == EXPECTED_SKIPPED


def test_oasst_refusals_name_the_shape_found(tmp_path, write_jsonl):
    f = write_jsonl(tmp_path / "t.jsonl", [{"conversation": [], "id": 3}])
    with pytest.raises(SourceError, match=r"t.jsonl, line 1: not an oasst1 tree: found an object with keys "
                                          r"'conversation', 'id'; expected the nested export"):
        list(oasst1(f).iter_conversations())
    f = write_jsonl(tmp_path / "t.jsonl", [[1, 2]])
    with pytest.raises(SourceError, match=r"line 1: a JSON list, not an object"):
        list(oasst1(f).iter_conversations())
    f = write_jsonl(tmp_path / "t.jsonl", [{**TREE4, "replies": {"a": 1}}])
    with pytest.raises(SourceError, match=r"line 1: message r4 has 'replies' of type dict; it must be a list"):
        list(oasst1(f).iter_conversations())
    f = write_jsonl(tmp_path / "t.jsonl", [{**TREE4, "replies": ["just text"]}])
    with pytest.raises(SourceError, match=r"line 1: a reply of message r4 is a JSON str, not a message object"):
        list(oasst1(f).iter_conversations())
    # (a nested tree handed to the flat-rows path is read as trees: test_oasst_accounting.py)


@pytest.mark.parametrize("text", [7, ["a", "b"], {"t": "x"}])
def test_oasst_non_string_text_anywhere_in_a_tree_is_one_clear_error(tmp_path, write_jsonl, text):
    tree = msg("r", "prompter", "Hi", replies=[msg("g", "assistant", "ok", rank=0,
                                                   replies=[msg("deep", "prompter", "x")])])
    tree["replies"][0]["replies"][0]["text"] = text
    f = write_jsonl(tmp_path / "t.jsonl", nested([tree]))
    with pytest.raises(SourceError, match=rf"line 1: message deep has a {type(text).__name__} 'text' .*must be a "
                                          "string"):
        list(oasst1(f).iter_conversations())
