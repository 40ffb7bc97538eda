"""Bad-input catalogue, holdout data: the refusals and flags added for data no earlier test had seen (oasst
exports with lone surrogates, no usable conversation or mixed shapes; Gutenberg files with misplaced markers;
.bos.idx sidecars that disagree with their shard; prepare-data's --tokenizer; convert's nanogpt-train-bin; metadata.yaml ids that are no numbers, and
--eot-id/--bos-id that no token can hold)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from .test_bad_input_catalogue import (  # noqa: F401  (world: the fixture)
    Case,
    _copy,
    _jsonl,
    _oasst_trees,
    check_case,
    world,
)


def _oasst_files(w, tmp, *files):
    return ["build-all", "--cache-dir", str(tmp / "out"), "--tokenizer", str(w.tokenizer), "--only", "oasst1",
            "--oasst-data-files", *map(str, files), "--no-progress"]


def _tree(mid: str, answer: str | None) -> dict:
    replies = [] if answer is None else [{"message_id": f"{mid}-a", "role": "assistant", "text": answer, "replies": []}]
    return {"message_id": mid, "role": "prompter", "text": f"question {mid}?", "replies": replies}


def oasst_lone_surrogate(w, tmp):
    return _oasst_trees(w, tmp, _jsonl(tmp / "in" / "s.jsonl", [json.dumps(_tree("r", "fine")),
                                                                 json.dumps(_tree("q", "half \ud800 a pair"))]))


def oasst_no_assistant_reply(w, tmp):
    return _oasst_trees(w, tmp, _jsonl(tmp / "in" / "u.jsonl", [json.dumps(_tree("r", None))]))


def oasst_mixed_data_files(w, tmp):
    nested = _jsonl(tmp / "in" / "trees.jsonl", [json.dumps(_tree("r", "fine"))])
    flat = _jsonl(tmp / "in" / "rows.jsonl", [json.dumps({"message_id": "m", "parent_id": None, "message_tree_id": "m",
                                                         "role": "prompter", "text": "q"})])
    return _oasst_files(w, tmp, nested, flat)


def gutenberg_start_inside_a_book(w, tmp):
    books = tmp / "books"
    books.mkdir()
    (books / "x.txt").write_text("*** START OF BOOK A ***\nbody a\n*** START OF BOOK B ***\nbody b\n"
                                 "*** END OF BOOK B ***\n")
    return ["build-all", "--cache-dir", str(tmp / "out"), "--tokenizer", str(w.tokenizer), "--only", "gutenberg",
            "--gutenberg-dir", str(books), "--gutenberg-val-frac", "0", "--no-progress"]


def _nanogpt_with_sidecar(tmp):
    """A nanoGPT shard whose .bos.idx lists a position inside a document (it disagrees with the shard)."""
    from niels_gpt.formats import nanogpt

    d = tmp / "ng"
    d.mkdir()
    sink = nanogpt.NanogptSink(d / "data_000000.bin", "uint16")
    sink.write(np.asarray([50, 10, 11, 50, 12, 13, 50, 14]))
    sink.close()
    np.asarray([0, 3, 5, 6], dtype="<i4").tofile(d / "data_000000.bos.idx")
    return d


def convert_sidecar_disagrees(w, tmp):
    return ["convert", str(_nanogpt_with_sidecar(tmp)), str(tmp / "out"), "--to", "kempner-npy"]


def prepare_data_tokenizer_missing(w, tmp):
    return ["prepare-data", str(_nanogpt_with_sidecar(tmp)), "--tokenizer", str(tmp / "no-such-tokenizer")]


def convert_uint32_to_nanogpt_train_bin(w, tmp):
    src = tmp / "wide"
    src.mkdir()
    np.asarray([70_000, 5, 6], dtype="<u4").tofile(src / "a.bin")
    return ["convert", str(src), str(tmp / "out"), "--to", "nanogpt-train-bin", "--src-dtype", "uint32"]


def convert_metadata_yaml_id_not_a_number(w, tmp):
    # a hand-edited metadata.yaml: with an EOS id that is no number every document boundary was lost unnoticed
    src = tmp / "kf"
    src.mkdir()
    np.save(src / "shard_00000.npy", np.asarray([1, 2, 0, 3, 0], dtype="<u2"))
    (src / "metadata.yaml").write_text("tokenized_info:\n  dtype: uint16\n  eos_token_id: \"zero\"\n")
    return ["convert", str(src), str(tmp / "out"), "--to", "megatron"]


def convert_negative_eot_id(w, tmp):
    return ["convert", str(w.pretrain), str(tmp / "out"), "--to", "megatron", "--eot-id", "-1"]


def prepare_data_bos_id_beyond_the_dtype(w, tmp):
    return ["prepare-data", str(w.pretrain), "--bos-id", "70000"]


def _bump_val_tokens(cache):
    """meta.json with `totals.val_tokens` one higher: a field no reader uses, written as the writer would."""
    meta = json.loads((cache / "meta.json").read_text())
    meta["totals"]["val_tokens"] += 1
    (cache / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def inspect_edited_unread_field(w, tmp):
    c = _copy(w.pretrain, tmp / "c")
    _bump_val_tokens(c)
    return ["inspect", str(c)]


def verify_edited_unread_field(w, tmp):
    c = _copy(w.pretrain, tmp / "c")
    _bump_val_tokens(c)
    return ["verify", str(c)]


def inspect_interrupted_first_build(w, tmp):
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()  # a pid that is no longer running: its build died
    stage = tmp / "root" / "pretrain" / f"wikitext.tmp-{p.pid}"
    (stage / "train").mkdir(parents=True)
    return ["inspect", str(tmp / "root" / "pretrain" / "wikitext")]


CASES = [
    Case("oasst lone surrogate in a reply", oasst_lone_surrogate, ("s.jsonl", "line 2", "surrogate"),
         out="out/sft"),
    Case("oasst tree without an assistant reply", oasst_no_assistant_reply,
         ("u.jsonl", "no usable conversation", "no_assistant_turn", "needs an assistant turn"), out="out/sft"),
    Case("gutenberg: a second START before the first END", gutenberg_start_inside_a_book,
         ("x.txt", "line 3", "second '*** START OF'"), out="out/pretrain"),
    Case("convert: a .bos.idx that disagrees with its shard", convert_sidecar_disagrees,
         ("data_000000.bos.idx", "disagrees with the shard", "--bos-id ID"), out="out"),
    Case("prepare-data --tokenizer: no such tokenizer", prepare_data_tokenizer_missing, ("no-such-tokenizer",)),
    Case("convert --to nanogpt-train-bin: uint32 tokens", convert_uint32_to_nanogpt_train_bin,
         ("wide", "uint32", "reads train.bin/val.bin as uint16", "--dtype uint16"), out="out"),
    Case("convert: an EOS id in metadata.yaml that is no number", convert_metadata_yaml_id_not_a_number,
         ("metadata.yaml", "eos_token_id", "'zero'", "--eot-id"), out="out"),
    Case("convert --eot-id -1", convert_negative_eot_id, ("--eot-id -1", "not a token id", "uint16"), out="out"),
    Case("prepare-data --bos-id beyond uint16", prepare_data_bos_id_beyond_the_dtype,
         ("--bos-id 70000", "not a token id", "0..65535")),
    Case("inspect: a field no reader uses edited in meta.json", inspect_edited_unread_field,
         ("meta.json", "record_sha256", "rebuild"), reads=("pretrain",)),
    Case("verify: a field no reader uses edited in meta.json", verify_edited_unread_field,
         ("meta.json", "record_sha256"), report=True),
    Case("inspect: a first build that was interrupted", inspect_interrupted_first_build,
         ("wikitext", "interrupted", "build-all --cache-dir", "--only wikitext")),
    Case("oasst nested and flat files mixed", oasst_mixed_data_files,
         ("trees.jsonl", "rows.jsonl", "--oasst-trees-jsonl"), out="out/sft"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_gets_one_clear_line_and_no_complete_looking_output(case, world, tmp_path, capsys):  # noqa: F811
    check_case(case, world, tmp_path, capsys)
