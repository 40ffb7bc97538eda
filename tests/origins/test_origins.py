"""Origins in every cache: each document and example names its input, record and character range; every
executor writes the same bytes; verify and the readers check them; trace shows them."""

from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from niels_gpt.builders.run import BuildSpec, build
from niels_gpt.cache.cli import main
from niels_gpt.errors import CacheError
from niels_gpt.long_documents import encode_documents
from niels_gpt.meta import read_meta
from niels_gpt.sources.origins import read_table, split_rows
from niels_gpt.trace.documents import document_origin, find_document, read_origins


def _rows(cache, split: str) -> np.ndarray:
    """A split's origins (int64 [documents, 4]), read as trace reads them."""
    return read_origins(Path(cache), read_meta(str(cache)), split)[0]


def _table(cache) -> list[dict]:
    return read_origins(Path(cache), read_meta(str(cache)), "train")[1]


def run_build(inputs, out, log=None, **kw):
    """`build` over these inputs (each a path or URL) into `out`."""
    return build(BuildSpec(sources=[str(p) for p in inputs], out=str(out), **kw), log)

GUTENBERG = ("The Project Gutenberg eBook of A Small Book\n\nLicence words here.\n\n"
             "*** START OF THE PROJECT GUTENBERG EBOOK A SMALL BOOK ***\n\n"
             "Chapter one.\r\n\r\nIt was a small book about {n} small things.\n\n"
             "*** END OF THE PROJECT GUTENBERG EBOOK A SMALL BOOK ***\n\nMore licence words.\n")
WIKI = " = First Article = \n\n It has a line @-@ with a marker . \n\n = = Part = = \n\n More of it . \n" \
       " = Second Article = \n\n Short text . \n"


def _inputs(root: Path) -> list[Path]:
    root.mkdir(parents=True, exist_ok=True)
    lines = root / "a.jsonl"
    rows = [json.dumps({"text": f"line record {i} " + "word " * (i % 23)}) for i in range(120)]
    rows[5] = ""  # a blank line: records keep their own line numbers
    rows[9] = json.dumps({"text": "  "})  # an empty document: skipped, no origin
    lines.write_text("\n".join(rows) + "\n", encoding="utf-8")
    text = root / "b.txt"
    text.write_bytes(b"\xef\xbb\xbfa text file\r\nwith CRLF lines\r\n")
    table = pa.table({"text": [f"parquet row {i} " + "x " * (i % 7) for i in range(50)]})
    pq.write_table(table, root / "c.parquet", row_group_size=16)
    (root / "d.txt").write_text(GUTENBERG.format(n=3), encoding="utf-8")
    (root / "e.raw").write_text(WIKI, encoding="utf-8")
    return [lines, text, root / "c.parquet", root / "d.txt", root / "e.raw"]


def _build(inputs, out: Path, tok, executor: str, *extra: str) -> Path:
    if executor == "inprocess":  # the Python door only: every task in this process, through parts and the commit
        run_build(inputs, out, tokenizer=tok.model_path, executor="inprocess", workers=2, task_bytes=2000,
                   max_tokens=100_000, val_tokens=int(extra[1]), shard_bytes=1 << 20, seed=1,
                   name="same")
        return out
    args = ["build", *map(str, inputs), "--out", str(out), "--tokenizer", tok.model_path, "--name", "same",
            "--no-progress", "--executor", executor, "--task-bytes", "2000", "--seed", "1", "--shard-bytes",
            str(1 << 20), *extra]
    if executor != "inline":
        args += ["--workers", "2"]
    assert main(args) == 0
    return out


def _tree(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _record_text(entry: dict, record: int) -> str:
    """The text of the record an origin names, read again from its input."""
    path = entry["path"]
    if entry["kind"] == ".jsonl":
        with open(path, "rb") as f:
            f.seek(record)
            return json.loads(f.readline())["text"]
    if entry["kind"] == ".parquet":
        return pq.read_table(path).column("text")[record].as_py()
    return Path(path).read_bytes().decode("utf-8-sig").replace("\r\n", "\n")


def _documents(cache: Path, split: str, dtype) -> list[np.ndarray]:
    tokens = np.concatenate([np.fromfile(p, dtype=dtype) for p in sorted((cache / split).glob("shard_*.bin"))])
    eot = json.loads((cache / "meta.json").read_text())["document_separator"]["id"]
    ends = np.flatnonzero(tokens == eot)
    return [tokens[a:b] for a, b in zip(np.r_[0, ends[:-1] + 1], ends, strict=True)]


@pytest.fixture(scope="module")
def built(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("origins")
    inputs = _inputs(root / "in")
    caches = {ex: _build(inputs, root / ex / "c", tokenizer, ex, "--val-tokens", "300", "--max-tokens", "100000")
              for ex in ("inline", "processes", "inprocess")}
    return inputs, caches


def test_every_executor_writes_the_same_origins(built):
    _, caches = built
    ref = _tree(caches["inline"])
    assert {"origins.npy", "origins.json"} <= set(ref)
    for ex in ("processes", "inprocess"):
        assert _tree(caches[ex]) == ref, ex
    meta = json.loads(ref["meta.json"])
    assert meta["origins"] == {"file": "origins.npy", "inputs": "origins.json"}
    assert {"origins.npy", "origins.json"} <= set(meta["files"])


@pytest.mark.parametrize("split", ["train", "val"])
def test_each_origin_points_at_the_text_of_its_document(built, tokenizer, split):
    _check_origins(built[1]["inline"], tokenizer, split, {".jsonl", ".txt", ".parquet", ".raw"})


def test_a_shuffled_build_keeps_each_documents_origin(built, tokenizer, tmp_path):
    inputs, _ = built
    cache = _build(inputs, tmp_path / "c", tokenizer, "inline", "--shuffle-buffer", "16", "--val-tokens", "300")
    for split in ("train", "val"):
        _check_origins(cache, tokenizer, split, None)


def _check_origins(cache: Path, tokenizer, split: str, kinds_wanted) -> None:
    """Each document of `split` is the encoding of the text its origin names."""
    table = _table(cache)
    rows = _rows(cache, split)
    docs = _documents(cache, split, np.dtype(tokenizer.token_dtype))
    assert len(rows) == len(docs) > 0
    cut = json.loads((cache / "meta.json").read_text())["cuts"][split]
    kinds = set()
    for d, ((i, record, a, b), ids) in enumerate(zip(rows.tolist(), docs, strict=True)):
        entry = table[i]
        kinds.add(Path(entry["path"]).suffix)
        text = _record_text(entry, record)
        if entry["path"].endswith(".raw"):  # a wikitext article: from its heading
            assert a >= 0 and b == -1 and text[a:].startswith("= ")
            continue
        want = encode_documents(tokenizer, [text[a:b]], 1)[0]
        if cut and cut["document"] == d:
            assert list(ids) == list(want)[:len(ids)]
        else:
            assert list(ids) == list(want), (entry, record)
    if split == "train" and kinds_wanted:
        assert kinds == kinds_wanted


def test_gutenberg_and_crlf_ranges_are_of_the_normalised_text(built):
    _, caches = built
    cache = caches["inline"]
    table = _table(cache)
    rows = _rows(cache, "train").tolist()
    by_name = {Path(table[i]["path"]).name: (record, a, b) for i, record, a, b in rows}
    text = GUTENBERG.format(n=3).replace("\r\n", "\n")
    _, a, b = by_name["d.txt"]
    assert text[a:b] == "Chapter one.\n\nIt was a small book about 3 small things."
    assert by_name["b.txt"] == (0, 0, len("a text file\nwith CRLF lines\n"))


def test_val_per_input_pieces_are_runs_of_their_record(tmp_path, tokenizer):
    src = tmp_path / "long.txt"
    src.write_text("\n\n".join(f"paragraph {i} " + "word " * 300 for i in range(12)), encoding="utf-8")
    caches = [_build([src], tmp_path / ex / "c", tokenizer, ex, "--val-frac", "0.3", "--val-per-input")
              for ex in ("inline", "processes")]
    assert _tree(caches[0]) == _tree(caches[1])
    rows = np.concatenate([_rows(caches[0], s) for s in ("train", "val")])
    spans = sorted((a, b) for _, _, a, b in rows.tolist())
    assert len(spans) > 2 and spans[0][0] == 0 and spans[-1][1] == len(src.read_text())
    assert all(x[1] == y[0] for x, y in zip(spans, spans[1:], strict=False))  # the pieces tile the file


def test_chat_examples_name_their_records(tmp_path, tokenizer):
    conv = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    msgs = tmp_path / "m.jsonl"
    msgs.write_text("\n".join(json.dumps({"messages": conv + [{"role": "user", "content": str(i)},
                                                               {"role": "assistant", "content": "ok " * i}]})
                              for i in range(30)) + "\n", encoding="utf-8")
    share = tmp_path / "s.jsonl"
    share.write_text("\n".join(json.dumps({"conversations": [{"from": "human", "value": f"q{i}"},
                                                             {"from": "gpt", "value": f"a{i}"}]})
                               for i in range(20)) + "\n", encoding="utf-8")
    dolly = tmp_path / "d.jsonl"
    dolly.write_text("\n".join(json.dumps({"instruction": f"do {i}", "context": "", "response": f"done {i}",
                                           "category": "x"}) for i in range(20)) + "\n", encoding="utf-8")
    trees = tmp_path / "o.jsonl"
    trees.write_text("\n".join(json.dumps({"message_tree_id": f"t{i}", "prompt": {
        "message_id": f"p{i}", "role": "prompter", "text": f"ask {i}", "lang": "en", "rank": None, "replies": [
            {"message_id": f"r{i}", "role": "assistant", "text": f"answer {i}", "lang": "en", "rank": 0,
             "replies": []}]}}) for i in range(15)) + "\n", encoding="utf-8")
    trees_rows = tmp_path / "rows.jsonl"
    trees_rows.write_text("\n".join(json.dumps(r) for i in range(10) for r in (
        {"message_id": f"p{i}", "parent_id": None, "message_tree_id": f"t{i}", "role": "prompter",
         "text": f"row ask {i}", "lang": "en", "rank": None},
        {"message_id": f"r{i}", "parent_id": f"p{i}", "message_tree_id": f"t{i}", "role": "assistant",
         "text": f"row answer {i}", "lang": "en", "rank": 0})) + "\n", encoding="utf-8")
    caches = []
    for ex in ("inline", "processes"):
        out = tmp_path / ex / "c"
        for name, inputs in (("messages", [msgs, share, dolly, trees]), ("rows", [trees_rows])):
            args = ["build", *map(str, inputs), "--chat", "--out", str(out / name), "--tokenizer", tokenizer.model_path,
                    "--name", name, "--no-progress", "--executor", ex, "--task-bytes", "1500", "--val-frac", "0.2"]
            assert main(args + (["--workers", "2"] if ex != "inline" else [])) == 0
        caches.append(out)
    assert _tree(caches[0]) == _tree(caches[1])
    for name in ("messages", "rows"):
        cache = caches[0] / name
        table = _table(cache)
        meta = json.loads((cache / "meta.json").read_text())
        seen = set()
        for split in ("train", "val"):
            rows = _rows(cache, split)
            offsets = np.load(cache / f"{split}_idx.npy")
            assert len(rows) == len(offsets) == meta["totals"][f"{split}_examples"]
            tokens = np.fromfile(cache / f"{split}_tokens.bin", dtype=np.dtype(tokenizer.token_dtype))
            ends = np.r_[offsets[1:], len(tokens)]
            for (i, record, a, b), s, e in zip(rows.tolist(), offsets, ends, strict=True):
                assert (a, b) == (-1, -1)
                with open(table[i]["path"], "rb") as f:
                    f.seek(record)
                    line = json.loads(f.readline())
                answer = {"messages": lambda r: r["messages"][-1]["content"],
                          "conversations": lambda r: r["conversations"][-1]["value"],
                          "response": lambda r: r["response"], "prompt": lambda r: r["prompt"]["replies"][0]["text"],
                          "parent_id": lambda r: "row answer " + r["message_id"][1:]}
                key = next(k for k in answer if k in line)
                want = answer[key](line).strip()
                assert tokenizer.decode(tokens[s:e].tolist()).rstrip().endswith(want) or want in \
                    tokenizer.decode(tokens[s:e].tolist()), (key, want)
                seen.add(Path(table[i]["path"]).name)
        assert len(seen) == (4 if name == "messages" else 1)


def test_verify_catches_a_damaged_origins_file(built, tmp_path):
    import shutil

    _, caches = built
    cache = tmp_path / "c"
    shutil.copytree(caches["inline"], cache)
    assert main(["verify", str(cache)]) == 0
    path = cache / "origins.npy"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    assert main(["verify", str(cache)]) == 1
    with pytest.raises(CacheError, match="origins.npy"):
        document_origin(str(cache), "train", 0)


def test_trace_names_the_input_and_record_and_finds_the_document_back(built):
    inputs, caches = built
    cache = str(caches["inline"])
    rows = _rows(Path(cache), "train").tolist()
    d = next(k for k, r in enumerate(rows) if r[0] == 0 and r[1] > 0)  # a JSON Lines record past line 1
    origin = document_origin(cache, "train", d)
    line = Path(inputs[0]).read_bytes()[:rows[d][1]].count(b"\n") + 1
    assert origin["where"] == f"{inputs[0].resolve()}, line {line}" and origin["input"] == str(inputs[0].resolve())
    assert origin["chars"][0] == 0 and origin["input_sha256"].startswith("sha256:")
    assert find_document(cache, "a.jsonl", line) == ("train", d)
    par = next(k for k, r in enumerate(rows) if r[0] == 2)
    assert document_origin(cache, "train", par)["where"].endswith(f"c.parquet, row {rows[par][1]}")
    assert find_document(cache, "c.parquet", rows[par][1]) == ("train", par)
    with pytest.raises(Exception, match="no document of"):
        find_document(cache, "a.jsonl", 6)  # the blank line


def test_packed_bins_know_their_examples(tmp_path, tokenizer):
    src = tmp_path / "m.jsonl"
    src.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": f"question {i} " + "q " * (i % 9)},
                                                      {"role": "assistant", "content": "answer " * (1 + i % 13)}]})
                             for i in range(60)) + "\n", encoding="utf-8")
    cache, out = tmp_path / "sft", tmp_path / "packed"
    assert main(["build", str(src), "--chat", "--out", str(cache), "--tokenizer", tokenizer.model_path,
                 "--no-progress", "--val-frac", "0.2"]) == 0
    assert main(["pack-sft", str(cache), str(out), "--pack-size", "96"]) == 0
    for shard, split in ((out, "train"), (out / "val", "val")):
        manifest = json.loads((shard / "manifest.json").read_text())
        assert manifest["examples"]["split"] == split
        examples = np.load(shard / "examples.npy")
        offsets, starts = np.load(shard / "seq_offsets.npy"), np.load(shard / "seq_starts.npy")
        ids, plen = np.load(shard / "input_ids.npy"), np.load(shard / "packed_len.npy")
        idx = np.load(cache / f"{split}_idx.npy")
        tokens = np.fromfile(cache / f"{split}_tokens.bin", dtype=np.dtype(tokenizer.token_dtype))
        ends = np.r_[idx[1:], len(tokens)]
        assert sorted(examples.tolist()) == list(range(len(idx)))  # every example once (none over 96 tokens)
        for b in range(len(plen)):
            cut = np.r_[starts[offsets[b]:offsets[b + 1]], plen[b]]
            for j, e in enumerate(examples[offsets[b]:offsets[b + 1]].tolist()):
                assert ids[b, cut[j]:cut[j + 1]].tolist() == tokens[idx[e]:ends[e]].tolist()
    assert main(["verify", str(out)]) == 0
    data = bytearray((out / "examples.npy").read_bytes())
    data[-1] ^= 1
    (out / "examples.npy").write_bytes(bytes(data))
    assert main(["verify", str(out)]) == 1


@pytest.mark.parametrize("to", ["niels", "nanogpt", "kempner-npy", "megatron"])
def test_convert_carries_the_origins(built, tmp_path, to):
    _, caches = built
    src = caches["inline"]
    out = tmp_path / to
    assert main(["convert", str(src), str(out), "--to", to]) == 0
    if to == "niels":  # our own format: origins listed in meta.json, the same files as the cache converted
        meta = json.loads((out / "meta.json").read_text())
        assert meta["origins"] == {"file": "origins.npy", "inputs": "origins.json"}
        assert all((out / f).read_bytes() == (src / f).read_bytes() for f in ("origins.npy", "origins.json"))
    for split in ("train", "val"):
        want = _rows(src, split)
        if to == "niels":
            assert document_origin(str(out), split, 0)["where"] == document_origin(str(src), split, 0)["where"]
        else:  # a sidecar beside the split's files (its rows only, every field), listed in the output's receipt
            side = out / split / "origins"
            table = read_table((side / "origins.json").read_bytes(), "sidecar")
            assert table["splits"] == {split: len(want)} and table["inputs"] == _table(src)
            assert split_rows(np.load(side / "origins.npy"), table, split).tolist() == want.tolist()
            receipt = json.loads((out / "niels_receipt.json").read_text())
            assert f"{split}/origins/origins.npy" in receipt["files"]
    assert main(["verify", str(out)]) == 0
    assert main(["inspect", str(out)]) == 0


def test_records_of_csv_arrow_json_arrays_and_compressed_lines(tmp_path, tokenizer):
    import gzip

    texts = [f"record number {i} " + "y " * (i % 5) for i in range(12)]
    (tmp_path / "a.csv").write_text("text\n" + "\n".join(texts) + "\n", encoding="utf-8")
    with pa.OSFile(str(tmp_path / "b.arrow"), "wb") as sink, pa.ipc.new_file(sink, pa.schema([("text", pa.string())])) as w:
        for k in range(0, 12, 5):
            w.write_table(pa.table({"text": texts[k:k + 5]}))
    (tmp_path / "c.json").write_text(json.dumps([{"text": t} for t in texts], indent=1), encoding="utf-8")
    (tmp_path / "d.jsonl.gz").write_bytes(gzip.compress(("\n".join(json.dumps({"text": t}) for t in texts)
                                                         + "\n").encode()))
    inputs = [tmp_path / n for n in ("a.csv", "b.arrow", "c.json", "d.jsonl.gz")]
    cache = _build(inputs, tmp_path / "c", tokenizer, "inline", "--val-tokens", "0")
    table = _table(cache)
    rows = _rows(cache, "train").tolist()
    assert len(rows) == 48
    records = {}
    for i, record, a, b in rows:
        records.setdefault(Path(table[i]["path"]).name, []).append(record)
        assert (a, b) == (0, len(texts[len(records[Path(table[i]["path"]).name]) - 1]))
    assert records["a.csv"] == list(range(2, 14))  # the line of each row (the header is line 1)
    assert records["b.arrow"] == list(range(12))  # the row, counted over the record batches
    assert records["c.json"] == list(range(1, 13))  # the element of the array, from 1
    c = next(k for k, r in enumerate(rows) if table[r[0]]["path"].endswith("c.json") and r[1] == 4)
    assert document_origin(str(cache), "train", c)["where"].endswith("c.json, element 4")
    data = gzip.decompress((tmp_path / "d.jsonl.gz").read_bytes())
    assert records["d.jsonl.gz"] == [0] + [k + 1 for k in range(len(data) - 1) if data[k:k + 1] == b"\n"]


def test_trace_prints_each_documents_input_record_and_record_text(built, tmp_path, tokenizer, capsys):
    from niels_gpt.trace.documents import record_text
    from niels_gpt.train.train import TrainConfig, train

    inputs, caches = built
    cache = str(caches["inline"])
    rows = _rows(Path(cache), "train").tolist()
    for i, want in ((0, None), (1, "a text file\nwith CRLF lines\n"), (2, None)):
        d = next(k for k, r in enumerate(rows) if r[0] == i)
        text = record_text(cache, "train", d)
        assert text == (want if want is not None else _record_text(
            _table(cache)[i], rows[d][1]))
    run = tmp_path / "run"
    train(TrainConfig(data=cache, out_dir=str(run), depth=1, n_embd=32, n_head=2, sequence_len=16,
                      device_batch_size=2, steps=2, eval_steps=1, log_every=0), log=lambda *a: None)
    capsys.readouterr()
    assert main(["trace", str(run), "--step", "1", "--text"]) == 0
    out = capsys.readouterr().out
    assert "; from " in out and ", characters " in out and "    record " in out
    first = json.loads(main(["trace", str(run), "--step", "1", "--json"]) == 0 and capsys.readouterr().out)
    doc = next(d for q in first["sequences"] for d in q["documents"] if d["input"].endswith((".jsonl", ".parquet")))
    name, record = Path(doc["input"]).name, int(doc["where"].rsplit(" ", 1)[1])  # a JSON Lines line, a Parquet row
    assert main(["trace", str(run), "--document", f"{name}:{record}"]) == 0
    assert f"{doc['split']}:{doc['document']}" in capsys.readouterr().out
    assert main(["trace", str(run), "--step", "1", "--html", str(tmp_path / "step1.html")]) == 0
    page = (tmp_path / "step1.html").read_text(encoding="utf-8")
    assert page.count(html.escape(doc["where"])) >= 2  # in the hover title and in the side list
