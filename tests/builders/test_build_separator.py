"""The parallel build with a user tokenizer's conventions (--eos, --bos, --separator) writes what `build` writes."""

from __future__ import annotations

import json

import pytest

from niels_gpt.builders.plan import make_plan
from niels_gpt.builders.run import BuildSpec, build
from niels_gpt.cache.cli import main
from niels_gpt.cache.meta import read_meta
from niels_gpt.tokenizer import load_tokenizer

from ..tokenizer_backends.conftest import bpe_json  # noqa: F401  (shared fixture)


def run_build(inputs, out, log=None, **kw):
    """`build` over these inputs (each a path or URL) into `out`."""
    return build(BuildSpec(sources=[str(p) for p in inputs], out=str(out), **kw), log)

pytest.importorskip("tokenizers")

OPTIONS = {  # build's flags; each a document separator of its own
    "default": [],
    "eos": ["--eos", "<|im_start|>"],
    "bos": ["--bos", "<|im_start|>", "--separator", "bos"],
}
# val is met inside a document and train too, so both cuts of the separator's position are checked
BUDGETS = ["--val-tokens", "3001", "--max-tokens", "40003", "--shard-bytes", "16KB", "--seed", "7", "--name", "mine"]


@pytest.fixture(scope="module")
def jsonl(corpus, tmp_path_factory):
    """Real documents, one per line, with an empty and a whitespace one (skipped by both commands)."""
    docs = [d for d in corpus["docs"][:300] if isinstance(d, str) and d.strip()]
    docs[10], docs[20] = "", "  \n "
    path = tmp_path_factory.mktemp("sep") / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def built(jsonl, bpe_json, tmp_path_factory):  # noqa: F811
    """`build` with each option: the reference caches."""
    root = tmp_path_factory.mktemp("sep-build")
    for name, opts in OPTIONS.items():
        assert main(["build", str(jsonl), "--out", str(root / name), "--tokenizer", str(bpe_json), *opts, *BUDGETS,
                     "--no-progress"]) == 0
    return root


def _conventions(opts: list[str]) -> dict[str, str]:
    return dict(zip((o.lstrip("-") for o in opts[::2]), opts[1::2], strict=True))


def _comparable(tree: dict[str, bytes]) -> dict[str, object]:
    """The cache's files, meta.json without `source` (each command names what it read in its own words)."""
    out = dict(tree)
    meta = json.loads(out.pop("meta.json"))
    del meta["source"]
    meta.pop("record_sha256")  # the record's checksum covers the source too
    return {**out, "meta.json": meta}


@pytest.mark.parametrize("executor", ["inline", "processes"])
@pytest.mark.parametrize("option", list(OPTIONS))
def test_build_writes_builds_bytes_for_each_separator(jsonl, bpe_json, built, tree, tmp_path, executor,  # noqa: F811
                                                           option):
    out = tmp_path / "mine"
    assert main(["build", str(jsonl), "--out", str(out), "--tokenizer", str(bpe_json), *OPTIONS[option], *BUDGETS,
                 "--executor", executor, "--workers", "2", "--task-bytes", "20000", "--no-progress"]) == 0
    ref = built / option
    assert _comparable(tree(out)) == _comparable(tree(ref))
    meta = read_meta(str(out))
    assert meta["cuts"]["val"] is not None and meta["cuts"]["train"] is not None  # both budgets cut a document
    position = "before every document" if option == "bos" else "after every document"
    assert meta["document_separator"]["position"] == position
    if option != "default":
        assert meta["document_separator"]["id"] == load_tokenizer(bpe_json).token_to_id("<|im_start|>")
        assert meta["tokenizer"]["options"] == _conventions(OPTIONS[option])


def test_each_option_set_has_its_own_task_ids_and_receipts(jsonl, bpe_json, built, tree, tmp_path):  # noqa: F811
    kw = {"max_tokens": 40_003, "val_tokens": 3001, "shard_bytes": 16_384, "seed": 7,
          "name": "mine", "executor": "inprocess", "task_bytes": 20_000, "keep_parts": True}
    ids = {}
    for name, opts in OPTIONS.items():
        tok = load_tokenizer(bpe_json, **_conventions(opts))
        ids[name] = [t.id for t in make_plan([jsonl], tokenizer=tok, task_bytes=20_000).tasks]
    assert len({tuple(v) for v in ids.values()}) == 3 and not set(ids["eos"]) & set(ids["bos"])
    out = tmp_path / "mine"
    first = run_build([jsonl], out, tokenizer=bpe_json, eos="<|im_start|>", **kw)
    assert first["reused"] == 0 and first["ran"] == len(ids["eos"])
    # the same work directory, another separator: no receipt of the EOS build passes for a BOS task
    s = run_build([jsonl], out, tokenizer=bpe_json, bos="<|im_start|>", separator="bos", **kw)
    assert s["reused"] == 0 and s["ran"] == len(ids["bos"])
    assert _comparable(tree(out)) == _comparable(tree(built / "bos"))
    plan = json.loads((out.parent / (out.name + ".build") / "plan.json").read_text())
    assert plan["tokenizer_options"] == {"bos": "<|im_start|>", "separator": "bos"}
    # and the same settings again reuse every receipt
    s = run_build([jsonl], out, tokenizer=bpe_json, bos="<|im_start|>", separator="bos", **kw)
    assert s["reused"] == len(ids["bos"]) and s["ran"] == 0
    assert _comparable(tree(out)) == _comparable(tree(built / "bos"))
