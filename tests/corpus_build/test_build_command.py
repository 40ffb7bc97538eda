"""`build SRC... --out DIR --tokenizer TOK`: any corpus, any tokenizer, the usual cache."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from niels_gpt.builders.run import BuildSpec, build
from niels_gpt.cache.cli import main
from niels_gpt.cache.meta import read_meta
from niels_gpt.cache.pretrain_dataset import PretrainTokenStreamDataset
from niels_gpt.cache.sft_dataset import SFTExampleDataset
from niels_gpt.errors import SourceError
from niels_gpt.tokenizer import load_tokenizer

from .conftest import docs


def build_meta(sources, out, **kw):
    """`build` (inline, one encode worker unless given) into `out`; returns the cache's meta.json."""
    build(BuildSpec(sources=list(sources), out=str(out), **{"executor": "inline", "workers": 1, **kw}),
          log=lambda msg: None)
    return read_meta(str(out))

pytest.importorskip("tokenizers")


def nonzero(counts: dict) -> dict:
    return {k: v for k, v in counts.items() if v}


def shard_tokens(out) -> list[int]:
    return np.concatenate([np.fromfile(p, dtype="<u2") for p in sorted((out / "train").glob("shard_*.bin"))]).tolist()


def test_every_file_kind_in_a_directory_becomes_one_cache(tmp_path, corpus_dir, bpe_json):
    d, order = corpus_dir
    tok = load_tokenizer(bpe_json)
    assert main(["build", str(d), "--out", str(tmp_path / "c"), "--tokenizer", str(bpe_json), "--no-progress"]) == 0
    eos = tok.separator.id
    assert shard_tokens(tmp_path / "c") == [i for t in order for i in tok.encode(t) + [eos]]
    meta = read_meta(str(tmp_path / "c"))
    assert meta["totals"]["train_documents"] == len(order) and meta["document_separator"]["id"] == eos
    assert meta["source"]["name"] == "corpus" and len(meta["source"]["files"]) == 7


def test_output_is_byte_identical_for_any_worker_count(tmp_path, corpus_dir, tiktoken_file):
    d, _ = corpus_dir
    outs = []
    for w in ("1", "2"):
        out = tmp_path / f"w{w}"
        main(["build", str(d), str(d / "a.jsonl"), "--out", str(out), "--tokenizer", str(tiktoken_file),
              "--workers", w, "--val-tokens", "300", "--shard-bytes", "1KiB", "--name", "same", "--no-progress"])
        outs.append({p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()})
    assert outs[0] == outs[1] and len(outs[0]) > 4


def test_globs_and_files_mix_in_the_order_given(tmp_path, corpus_dir, bpe_json):
    d, order = corpus_dir
    tok = load_tokenizer(bpe_json)
    build_meta([d / "g.md", str(d / "*.jsonl")], str(tmp_path / "c"), tokenizer=tok)
    assert shard_tokens(tmp_path / "c") == [i for t in order[13:14] + order[:3] for i in tok.encode(t) + [tok.separator.id]]


def test_val_frac_splits_by_document_deterministically(tmp_path, corpus_dir, bpe_json):
    d, order = corpus_dir
    tok = load_tokenizer(bpe_json)
    metas = [build_meta([d], str(tmp_path / n), tokenizer=tok, val_frac=0.3, seed=7, name="x") for n in "ab"]
    assert (tmp_path / "a" / "val" / "shard_00000.bin").read_bytes() == (tmp_path / "b" / "val" / "shard_00000.bin").read_bytes()
    t = metas[0]["totals"]
    assert t["train_documents"] + t["val_documents"] == len(order) and t["val_documents"] > 0
    assert "by document" in metas[0]["split_rule"]
    ds = PretrainTokenStreamDataset(str(tmp_path / "a" / "val"), T=16, device="cpu")
    x, y = ds.get_batch(B=2, generator=torch.Generator().manual_seed(0))
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_bad_record_is_named_by_file_and_line(tmp_path, bpe_json):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text(json.dumps({"text": "fine"}) + "\n\n{broken\n" + json.dumps({"body": "x"}) + "\n")
    tok = load_tokenizer(bpe_json)
    with pytest.raises(SourceError, match=r"a.jsonl, line 3: not valid JSON .*--on-bad-record skip"):
        build_meta([tmp_path / "in"], str(tmp_path / "c"), tokenizer=tok)
    assert not (tmp_path / "c" / "meta.json").exists()
    rc = main(["build", str(tmp_path / "in"), "--out", str(tmp_path / "c"), "--tokenizer", str(bpe_json)])
    assert rc == 1
    meta = build_meta([tmp_path / "in"], str(tmp_path / "c"), tokenizer=tok, on_bad_record="skip")
    assert nonzero(meta["skipped"]) == {"invalid_json": 1, "missing_field": 1}


def test_missing_field_and_non_text_are_named(tmp_path, bpe_json):
    tok = load_tokenizer(bpe_json)
    (tmp_path / "a.jsonl").write_text(json.dumps({"body": "x"}) + "\n")
    with pytest.raises(SourceError, match=r"a.jsonl, line 1: no 'text' field \(fields: \['body'\]\); pass --text-field"):
        build_meta([tmp_path / "a.jsonl"], str(tmp_path / "c"), tokenizer=tok)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["ok", None], "n": [1, 2]}), tmp_path / "b.parquet")
    with pytest.raises(SourceError, match=r"b.parquet, row 0: field 'n' is int, not text"):
        build_meta([tmp_path / "b.parquet"], str(tmp_path / "c"), tokenizer=tok, text_field="n")
    meta = build_meta([tmp_path / "b.parquet"], str(tmp_path / "c"), tokenizer=tok)
    assert nonzero(meta["skipped"]) == {"null_text": 1}


def test_unknown_sources_are_refused_by_name(tmp_path, bpe_json):
    tok = load_tokenizer(bpe_json)
    (tmp_path / "x.docx").write_text("?")
    with pytest.raises(SourceError, match=r"x.docx: unknown file kind"):
        build_meta([tmp_path / "x.docx"], str(tmp_path / "c"), tokenizer=tok)
    with pytest.raises(SourceError, match=r"nothing-here.jsonl: no such file or directory"):
        build_meta([str(tmp_path / "nothing-here.jsonl")], str(tmp_path / "c"), tokenizer=tok)
    with pytest.raises(SourceError, match=r"\*.parquet: this glob matches no file"):
        build_meta([str(tmp_path / "*.parquet")], str(tmp_path / "c"), tokenizer=tok)


def test_chat_messages_build_an_sft_cache_with_the_template_mask(tmp_path, hf_dir):
    tok = load_tokenizer(hf_dir)
    texts = docs(6)
    rows = [{"messages": [{"role": "user", "content": texts[i]}, {"role": "assistant", "content": texts[i + 1]}]}
            for i in range(0, 6, 2)]
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows)
                                         + json.dumps({"messages": [{"role": "bot", "content": "x"}]}) + "\n")
    with pytest.raises(SourceError, match=r"chat.jsonl, line 4: message 0 is not"):
        build_meta([tmp_path / "chat.jsonl"], str(tmp_path / "s"), tokenizer=tok, chat=True)
    rc = main(["build", str(tmp_path / "chat.jsonl"), "--chat", "--out", str(tmp_path / "s"), "--tokenizer",
               str(hf_dir), "--on-bad-record", "skip", "--no-progress"])
    assert rc == 0
    meta = read_meta(str(tmp_path / "s"))
    assert meta["kind"] == "sft" and meta["totals"]["train_examples"] == 3 and nonzero(meta["skipped"]) == {"bad_messages": 1}
    ds = SFTExampleDataset(str(tmp_path / "s" / "train_tokens.bin"), str(tmp_path / "s" / "train_idx.npy"),
                           T=512, device="cpu", eot_id=tok.eot_id)
    _, _, ym = ds.collate(np.array([0]))
    trained = [t for t in ym[0].tolist() if t != -100]
    assert tok.decode(trained, skip_special_tokens=False) == texts[1] + "<|im_end|>\n"


def test_pretraining_flags_are_refused_with_chat(tmp_path, hf_dir):
    from niels_gpt.errors import ConfigError

    (tmp_path / "c.jsonl").write_text("{}\n")
    with pytest.raises(ConfigError, match=r"--val-tokens, --shuffle-buffer apply to pretraining caches"):
        build_meta([tmp_path / "c.jsonl"], str(tmp_path / "s"), tokenizer=load_tokenizer(hf_dir), chat=True,
                     val_tokens=10, shuffle_buffer=100)


def test_chat_columns_make_one_user_and_one_assistant_turn(tmp_path, hf_dir):
    import csv

    tok = load_tokenizer(hf_dir)
    with open(tmp_path / "qa.csv", "w", newline="") as f:
        csv.writer(f).writerows([["question", "answer"], ["What is 2+2?", "Four."], ["Capital of France?", "Paris."]])
    meta = build_meta([tmp_path / "qa.csv"], str(tmp_path / "s"), tokenizer=tok, chat=True,
                        chat_columns=["question", "answer"])
    assert meta["totals"]["train_examples"] == 2
    with pytest.raises(SourceError, match=r"qa.csv, line 2: column 'prompt' is missing"):
        build_meta([tmp_path / "qa.csv"], str(tmp_path / "s2"), tokenizer=tok, chat=True,
                     chat_columns=["prompt", "answer"])


def test_bos_separator_from_the_command_line_is_recorded(tmp_path, corpus_dir, bpe_json):
    d, order = corpus_dir
    main(["build", str(d / "a.jsonl"), "--out", str(tmp_path / "c"), "--tokenizer", str(bpe_json),
          "--bos", "<|im_start|>", "--separator", "bos", "--no-progress"])
    tok = load_tokenizer(bpe_json)
    bos = tok.token_to_id("<|im_start|>")
    assert shard_tokens(tmp_path / "c") == [i for t in order[:3] for i in [bos] + tok.encode(t)]
    meta = read_meta(str(tmp_path / "c"))
    assert meta["document_separator"]["position"] == "before every document"
    assert meta["tokenizer"]["options"] == {"bos": "<|im_start|>", "separator": "bos"}


def test_a_dataset_id_is_streamed_with_its_config_and_split(tmp_path, monkeypatch, bpe_json):
    """The hub is out of reach here: the id's stream is a local Parquet file streamed by `datasets` itself."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    import niels_gpt.sources.records as base  # patched where the build looks it up

    texts = docs(4)
    pq.write_table(pa.table({"content": texts}), tmp_path / "hub.parquet")
    calls = []

    def open_stream(path_or_id, what, *, streaming=True, **kwargs):
        calls.append((path_or_id, streaming, kwargs))
        return datasets.load_dataset("parquet", data_files=str(tmp_path / "hub.parquet"), split="train", streaming=True)

    monkeypatch.setattr(base, "open_stream", open_stream)
    tok = load_tokenizer(bpe_json)
    meta = build_meta(["someone/corpus"], str(tmp_path / "c"), tokenizer=tok, text_field="content",
                        hf_config="en", split="validation")
    assert calls and all(c == ("someone/corpus", True, {"name": "en", "split": "validation"}) for c in calls)
    assert shard_tokens(tmp_path / "c") == [i for t in texts for i in tok.encode(t) + [tok.separator.id]]
    assert meta["dataset_config"] == "en" and meta["streaming"] is True
    pq.write_table(pa.table({"content": [1]}), tmp_path / "hub.parquet")
    with pytest.raises(SourceError, match=r"someone/corpus, record 0: field 'content' is int, not text"):
        build_meta(["someone/corpus"], str(tmp_path / "c2"), tokenizer=tok, text_field="content")


def test_progress_eta_is_sized_by_input_bytes_where_they_match_the_text(corpus_dir):
    from niels_gpt.sources.corpus import corpus

    d, _ = corpus_dir
    plain = [d / "a.jsonl", d / "g.md"]
    assert corpus(plain).input_bytes() == sum(p.stat().st_size for p in plain)
    assert corpus([d]).input_bytes() is None  # compressed and columnar files: no byte-sized ETA


@pytest.mark.parametrize("library", [False, True], ids=["template", "sentinels"])
def test_chat_output_is_byte_identical_for_any_worker_count(tmp_path, hf_dir, tokenizer, library):
    texts = docs(700)  # more than one run of rendered conversations
    rows = [{"messages": [{"role": "user", "content": texts[i]}, {"role": "assistant", "content": texts[i + 1]}]}
            for i in range(0, len(texts) - 1, 2)]
    rows.insert(5, {"messages": [{"role": "user", "content": "no answer"}]})  # skipped, in order
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tok = str(tokenizer.model_path) if library else str(hf_dir)
    outs = []
    for w in ("1", "2", "0"):
        out = tmp_path / f"w{w}"
        assert main(["build", str(tmp_path / "chat.jsonl"), "--chat", "--out", str(out), "--tokenizer", tok,
                     "--workers", w, "--val-frac", "0.2", "--name", "same", "--no-progress"]) == 0
        outs.append({p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()})
    assert outs[0] == outs[1] == outs[2]
    meta = json.loads(outs[0]["meta.json"])
    assert meta["totals"]["train_examples"] + meta["totals"]["val_examples"] == len(rows) - 1


@pytest.mark.parametrize("budgets", [["--max-tokens", "0"], ["--max-tokens", "0", "--val-tokens", "0"]])
def test_an_empty_budget_is_refused_with_builds_own_flags(tmp_path, corpus_dir, bpe_json, capsys, budgets):
    d, _ = corpus_dir
    argv = ["build", str(d), "--out", str(tmp_path / "c"), "--tokenizer", str(bpe_json), "--no-progress", *budgets]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--max-tokens 0" in err and "--val-tokens" in err
    assert "--max-train-tokens" not in err and "--max-val-tokens" not in err
    assert not (tmp_path / "c").exists()
