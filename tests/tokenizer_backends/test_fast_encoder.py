"""The fast encoder (niels_gpt/tokenizer/fast.py): chosen per tokenizer, checked id for id before use, and a
cache built with it is the reference encoder's cache, shard for shard."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from niels_gpt.cache.build_cache import build_pretrain_cache
from niels_gpt.tokenizer import fast as fast_module
from niels_gpt.tokenizer import load_tokenizer
from niels_gpt.tokenizer.fast import ENV, fast_encoder

from ..conftest import REPO, SHARED_DATA, needs_shared, sample_texts

gigatoken = pytest.importorskip("gigatoken")
pytest.importorskip("tokenizers")


def _docs() -> list[str]:
    docs: list[str] = []
    for i, text in enumerate(sample_texts()):
        docs += text.split("\n\n") + (["", "  \n"] if i % 2 else ["\t"])
    return docs


@pytest.fixture(scope="module")
def gpt2_style_json(tmp_path_factory):
    """A byte-level BPE tokenizer.json with GPT-2's pre-tokenizer (ByteLevel with its regex)."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(sample_texts(), trainers.BpeTrainer(
        vocab_size=800, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
        special_tokens=["<|endoftext|>"]))
    path = tmp_path_factory.mktemp("gpt2style") / "tokenizer.json"
    tok.save(str(path))
    return path


@pytest.fixture(scope="module")
def spm_bpe(tmp_path_factory):
    """The library's sentencepiece trainer with model_type bpe (byte fallback, as it always trains)."""
    from niels_gpt.tokenizer import TrainSettings, train_tokenizer

    out = tmp_path_factory.mktemp("spmbpe")
    return train_tokenizer(sample_texts(), out, settings=TrainSettings(vocab_size=1200, model_type="bpe"))


@pytest.fixture
def kinds(tiktoken_file, gpt2_style_json, spm_bpe):
    return {"tiktoken": lambda: load_tokenizer(tiktoken_file), "bpe-json": lambda: load_tokenizer(gpt2_style_json),
            "spm-bpe": lambda: load_tokenizer(spm_bpe.model_path)}


def _build(tok, out: Path, workers: int = 1) -> tuple[dict, dict]:
    build_pretrain_cache(_docs(), str(out), tokenizer=tok, max_train_tokens=30_000, max_val_tokens=1_500,
                         shard_bytes=16_384, seed=0, shuffle_buffer=None, num_workers=workers, dataset_name="x")
    shards = {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*.bin"))}
    meta = json.loads((out / "meta.json").read_text())
    return shards, meta


def _without_encoder(meta: dict) -> dict:
    return {k: v for k, v in meta.items() if k not in ("encoder", "record_sha256")}


@pytest.mark.parametrize("kind", ["tiktoken", "bpe-json", "spm-bpe"])
def test_a_cache_built_with_the_fast_encoder_is_the_reference_cache(tmp_path, kinds, kind, monkeypatch, capfd):
    tok = kinds[kind]()
    assert fast_encoder(tok) is not None, f"gigatoken should take the {kind} tokenizer"
    fast = [_build(tok, tmp_path / f"fast{w}", w) for w in (1, 2)]
    monkeypatch.setenv(ENV, "reference")
    ref_tok = kinds[kind]()
    assert fast_encoder(ref_tok) is None
    ref_shards, ref_meta = _build(ref_tok, tmp_path / "ref")
    for shards, meta in fast:
        assert shards == ref_shards and len(shards) > 2
        assert meta["encoder"] == f"gigatoken {gigatoken.__dict__.get('__version__') or fast_module._version()}"
        assert _without_encoder(meta) == _without_encoder(ref_meta)
    assert "encoder" not in ref_meta  # a cache of the reference encoder reads as every older cache does
    assert "warning" not in capfd.readouterr().err


def test_the_librarys_unigram_tokenizer_stays_on_the_reference_encoder(tmp_path, tokenizer, bpe_json):
    # gigatoken has no unigram model, nor this cl100k-style Split regex with possessive quantifiers
    from niels_gpt.tokenizer import TrainSettings, train_tokenizer

    unigram = train_tokenizer(sample_texts(), tmp_path, settings=TrainSettings(vocab_size=1000, model_type="unigram"))
    assert fast_encoder(unigram) is None
    assert fast_encoder(load_tokenizer(bpe_json)) is None
    assert fast_module.encoder_record(unigram) == {}
    default = load_tokenizer(tokenizer.model_path)  # a fresh object: the session's may have met NIELS_GPT_ENCODER
    assert fast_module.encoder_record(default) == {"encoder": f"gigatoken {fast_module._version()}"}


def test_without_gigatoken_the_reference_encoder_runs_with_no_warning(tiktoken_file, monkeypatch, capfd, tmp_path):
    monkeypatch.setitem(sys.modules, "gigatoken", None)  # `import gigatoken` raises ImportError
    tok = load_tokenizer(tiktoken_file)
    assert fast_encoder(tok) is None
    _, meta = _build(tok, tmp_path / "c")
    assert "encoder" not in meta
    assert capfd.readouterr().err == ""


class _Wrong:
    """gigatoken's encoder for the tokenizer, off by one id on texts containing `marker`."""

    def __init__(self, giga, marker: str):
        self.giga, self.marker = giga, marker

    def encode(self, text):
        ids = np.asarray(self.giga.encode(text))
        return ids + 1 if self.marker in text else ids


@pytest.mark.parametrize("marker, where", [("日本", "the built-in check text"), (" the ", "a document of the input")])
def test_an_encoder_that_differs_is_not_used_and_says_so(tiktoken_file, monkeypatch, capfd, tmp_path, marker, where):
    real = fast_module._build
    monkeypatch.setattr(fast_module, "_build", lambda g, tok: _Wrong(real(g, tok), marker))
    tok = load_tokenizer(tiktoken_file)
    assert any(marker in t for t in fast_module.torture_texts(tok)) == (marker == "日本")
    shards, meta = _build(tok, tmp_path / "c")
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: the fast encoder (gigatoken) gives other ids") \
        and where in err[0] and str(tiktoken_file) in err[0], err
    assert "encoder" not in meta
    monkeypatch.setenv(ENV, "reference")
    assert _build(load_tokenizer(tiktoken_file), tmp_path / "ref")[0] == shards


@needs_shared
@pytest.mark.parametrize("kind", ["tiktoken", "bpe-json", "spm-bpe"])
def test_the_fast_encoder_gives_the_reference_ids_on_real_text(kinds, kind):
    """About 1.5 MB of each real source's records: id for id, as the build encodes them."""
    tok = kinds[kind]()
    fast = fast_encoder(tok)
    assert fast is not None
    texts: list[str] = []
    for path in sorted(SHARED_DATA.rglob("*.jsonl")):
        size = 0
        with open(path, encoding="utf-8") as f:
            for line in f:
                record = json.loads(line)
                text = record.get("text") if isinstance(record, dict) else None
                if isinstance(text, str) and text.strip():
                    texts.append(text[:20_000])
                    size += len(texts[-1])
                if size > 1_500_000 // 8:
                    break
    for path in sorted(SHARED_DATA.rglob("*.txt"))[:20]:  # tinyshakespeare, wikitext, Gutenberg books
        texts.append(path.read_text(encoding="utf-8", errors="replace")[:100_000])
    assert len(texts) > 30
    for batch in (False, True):  # an `encode` per text, and one batch call for them all
        got = fast.encode_arrays(texts, batch)
        for text, ids in zip(texts, got, strict=True):
            assert ids.dtype == np.uint32 and ids.tolist() == list(tok.encode(text)), (batch, text[:80])


def test_build_imports_no_torch(tmp_path, tiktoken_file):
    src = tmp_path / "docs.txt"
    src.write_text("\n\n".join(sample_texts()[:2]), encoding="utf-8")
    code = ("import sys\nimport niels_gpt.builders\nfrom niels_gpt.cli import main\n"
            f"rc = main(['build', '--out', {str(tmp_path / 'c')!r}, '--tokenizer', {str(tiktoken_file)!r}, "
            f"'--executor', 'inline', '--no-progress', {str(src)!r}])\n"
            "assert rc == 0, rc\nassert 'torch' not in sys.modules, 'torch imported'\nprint('ok')\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-2000:]
    assert (tmp_path / "c" / "meta.json").is_file()


@pytest.mark.parametrize("batch", [False, True])
def test_a_document_gigatoken_cannot_take_is_encoded_by_the_reference(tiktoken_file, capfd, batch):
    """A lone surrogate (JSON's "\\ud800"): that document alone goes to tiktoken, which replaces it; no warning.
    A batch call that meets it encodes its texts one by one."""
    from niels_gpt.long_documents import encode_documents

    tok = load_tokenizer(tiktoken_file)
    docs = ["plain text", "a lone \ud800 surrogate", "more text"]
    assert [a is None for a in fast_encoder(tok).encode_arrays(docs, batch)] == [False, True, False]
    got = encode_documents(tok, docs, 1, arrays=True, batch=batch)
    assert [a.tolist() for a in got] == [a.tolist() for a in tok.encode_batch_arrays(docs)]
    assert fast_encoder(tok) is not None and capfd.readouterr().err == ""


def test_an_inline_build_encodes_in_batch_calls_on_a_model_per_thread_with_the_same_cache(tiktoken_file,
                                                                                         monkeypatch, tmp_path):
    """`build` inline with encode workers: GIL-free padded calls per run of documents (no awkward imported), each
    encode thread on a model of its own; the cache is byte for byte the one per-document calls make (one worker:
    this thread), and the reference encoder's."""
    from niels_gpt.builders import encode_pool, encoding
    from niels_gpt.cli import main

    monkeypatch.setattr(encoding, "ENCODE_RUN_CHARS", 2048)  # many runs, so that both threads take some
    models: set = set()
    real_models = fast_module.FastEncoder._models

    @contextlib.contextmanager
    def models_spy(self, size=0):
        with real_models(self, size) as giga:
            models.add(id(giga))
            yield giga

    monkeypatch.setattr(fast_module.FastEncoder, "_models", models_spy)

    src = tmp_path / "in"
    src.mkdir()
    for i, text in enumerate(sample_texts()):
        docs = [*text.split("\n\n"), " "]  # and a blank one, skipped
        (src / f"{i:02d}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    calls: list[tuple[int, bool]] = []
    real = fast_module.FastEncoder.encode_arrays

    def spy(self, texts, batch=False):
        calls.append((len(texts), batch))
        return real(self, texts, batch)

    monkeypatch.setattr(fast_module.FastEncoder, "encode_arrays", spy)

    def build(name: str, workers: int) -> dict:
        calls.clear()
        out = tmp_path / name / "cache"  # one name: meta.json records it
        assert main(["build", "--out", str(out), "--tokenizer", str(tiktoken_file), "--executor", "inline",
                     "--workers", str(workers), "--no-progress", "--shard-bytes", "65536", str(src)]) == 0
        return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}

    batched = build("batched", 2)
    assert calls and any(batch and n > 1 for n, batch in calls), calls
    assert 1 <= len(models) <= 2, models  # a model at most per encode thread, each kept for later runs
    one_by_one = build("one-by-one", 1)
    assert calls and not any(batch for _, batch in calls), calls
    monkeypatch.setenv(ENV, "reference")
    reference = build("reference", 2)
    assert not calls  # the reference encoder: no fast encoder call at all
    assert batched == one_by_one and len(batched) > 3
    assert {k: v for k, v in batched.items() if k != "meta.json"} == \
        {k: v for k, v in reference.items() if k != "meta.json"}
    pool = encode_pool.EncodePool(load_tokenizer(tiktoken_file), 2)
    try:
        assert not pool.batch and pool.pool._max_workers == 2  # NIELS_GPT_ENCODER=reference: no batch calls to make
    finally:
        pool.shutdown()
    monkeypatch.delenv(ENV)
    pool = encode_pool.EncodePool(load_tokenizer(tiktoken_file), 2)
    try:
        assert pool.batch and pool.pool._max_workers == 2
    finally:
        pool.shutdown()
    pool = encode_pool.EncodePool(load_tokenizer(tiktoken_file), 16)  # a model a thread: at most MAX_MODELS
    try:
        assert pool.batch and pool.pool._max_workers == encode_pool.MAX_MODELS == 4
    finally:
        pool.shutdown()
    code = ("import sys; from niels_gpt.cli import main; rc = main(sys.argv[1:]); "
            "assert 'awkward' not in sys.modules, 'awkward imported'; sys.exit(rc)")
    run = subprocess.run([sys.executable, "-c", code, "build", "--out", str(tmp_path / "fresh"), "--tokenizer",
                          str(tiktoken_file), "--executor", "inline", "--workers", "2", "--no-progress", str(src)],
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    assert run.returncode == 0, run.stderr[-2000:]


def test_padded_calls_at_once_each_get_a_model_of_their_own_kept_for_later(tiktoken_file):
    """Threads sharing one gigatoken model take turns, so calls made at the same time each get a model of their
    own: the checked one first, then new ones made the same way (each checked), given back for later calls; the
    ids are equal whichever model made them."""
    tok = load_tokenizer(tiktoken_file)
    fast = fast_encoder(tok)
    texts = sample_texts()
    together = threading.Barrier(3)
    got: dict = {}

    def hold(k: int) -> None:
        with fast._models() as giga:
            together.wait(timeout=60)  # all three hold a model at once
            got[k] = giga

    threads = [threading.Thread(target=hold, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    held = list(got.values())
    assert len({id(g) for g in held}) == 3 and any(g is fast.giga for g in held)
    expected = [list(tok.encode(t)) for t in texts]
    assert all([list(g.encode(t)) for t in texts] == expected for g in held)
    made = fast._make
    fast._make = None  # from now on nothing may be made: the models given back serve
    with fast._models() as a, fast._models() as b, fast._models() as c:
        assert {id(a), id(b), id(c)} == {id(g) for g in held}
    assert [a.tolist() for a in fast.encode_arrays(texts, batch=True)] == expected
    fast._make = made


def test_a_model_that_has_encoded_model_bytes_is_dropped_for_a_new_one(tiktoken_file, monkeypatch):
    """A model's pretoken cache grows with every new word it meets, so a model lent for padded calls is given
    back only until it has encoded MODEL_BYTES; then the next call gets a new one, with the same ids."""
    tok = load_tokenizer(tiktoken_file)
    fast = fast_encoder(tok)
    monkeypatch.setattr(fast_module, "MODEL_BYTES", 4096)  # (after the check text, which would count)
    texts = sample_texts()
    assert sum(len(t.encode()) for t in texts) > 4096
    used = []
    for _ in range(3):
        with fast._models() as giga:  # the model the next padded calls will get
            used.append(giga)
        ids = [a.tolist() for a in fast.encode_arrays(texts, batch=True)]
        assert ids == [list(tok.encode(t)) for t in texts]
    assert used[0] is fast.giga and len({id(g) for g in used}) == 3  # each dropped after its run, one made a run
    with fast._models(100) as small, fast._models() as other:
        assert small is not other
    with fast._models() as again:
        assert again is other or again is small  # under MODEL_BYTES: given back
    first = fast.giga  # one document a call (a build's worker, or one encode thread): the same bound
    assert [a.tolist() for a in fast.encode_arrays(texts)] == [list(tok.encode(t)) for t in texts]
    assert fast.giga is not first
    assert [a.tolist() for a in fast.encode_arrays(texts)] == [list(tok.encode(t)) for t in texts]
    encode_message = fast_module.message_encoder(tok, [[{"role": "user", "content": t} for t in texts]])
    first = fast.giga  # an SFT build's messages: the same bound
    assert [list(encode_message(t)) for t in texts] == [list(tok.encode(t)) for t in texts]
    assert fast.giga is not first


def test_a_model_made_from_a_replaced_file_is_dropped_for_the_checked_one(tiktoken_file, tmp_path):
    """A new model is made again from the tokenizer's file: a file replaced since (here by a shorter vocabulary)
    gives another model, whose ids differ on the check text, so the call shares the checked model instead (and
    no model is made again); the ids stay the tokenizer's."""
    path = tmp_path / "bpe.tiktoken"
    path.write_bytes(tiktoken_file.read_bytes())
    tok = load_tokenizer(path)
    fast = fast_encoder(tok)
    path.write_text("".join(tiktoken_file.read_text().splitlines(keepends=True)[:300]))  # replaced under it
    texts = sample_texts()
    with fast._models() as first, fast._models() as second:  # the second call finds no free model
        assert first is fast.giga and second is fast.giga and fast._make is None
        assert [a.tolist() for a in fast.encode_arrays(texts, batch=True)] == [list(tok.encode(t)) for t in texts]


def test_a_sentencepiece_model_is_encoded_document_by_document(spm_bpe, tiktoken_file):
    """gigatoken's sentencepiece backend encodes in batch calls about 3x slower than its warm per-document
    `encode` (docs/performance.md), so an inline build encodes its documents one by one on its threads; a
    byte-level BPE takes the padded batch calls. The ids are the same either way."""
    from niels_gpt.builders import encode_pool

    texts = sample_texts()[:20]
    for tok, batches in ((spm_bpe, False), (load_tokenizer(tiktoken_file), True)):
        fast = fast_encoder(tok)
        assert fast.batches is batches
        pool = encode_pool.EncodePool(tok, 2)
        try:
            assert pool.batch is batches and pool.pool._max_workers == 2
        finally:
            pool.shutdown()
        assert [a.tolist() for a in fast.encode_arrays(texts, batch=True)] == [list(tok.encode(t)) for t in texts]


def test_the_reference_setting_holds_for_a_tokenizer_that_made_its_fast_encoder(spm_bpe, monkeypatch):
    """NIELS_GPT_ENCODER=reference is asked on every use: a tokenizer object that made its fast encoder earlier
    (another build in the same process) builds with the reference encoder once it is set."""
    from niels_gpt.tokenizer.fast import encoder_record

    tok = load_tokenizer(spm_bpe.model_path)  # the library's default kind, which the fast encoder takes
    monkeypatch.delenv(ENV, raising=False)
    assert fast_encoder(tok) is not None and encoder_record(tok)
    monkeypatch.setenv(ENV, "reference")
    assert fast_encoder(tok) is None and encoder_record(tok) == {}


def test_the_recorded_version_is_the_installed_distributions():
    from importlib.metadata import version

    assert fast_module._version() == version("gigatoken")


def test_a_parallel_build_checks_its_first_documents_once_before_the_workers_fork(tiktoken_file, monkeypatch,
                                                                                   capfd, tmp_path):
    """The driver checks the sample, so a mismatch warns once and every worker, forked after, and meta.json
    follow its verdict: the reference encoder."""
    from niels_gpt.builders.run import BuildSpec, build

    real = fast_module._build
    monkeypatch.setattr(fast_module, "_build", lambda g, tok: _Wrong(real(g, tok), " the "))
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in _docs()), encoding="utf-8")
    build(BuildSpec(sources=[str(src)], out=str(tmp_path / "c"), tokenizer=str(tiktoken_file), executor="processes",
                    workers=2, task_bytes=20_000, progress=False), None)
    err = [line for line in capfd.readouterr().err.splitlines() if line.startswith("warning: the fast encoder")]
    assert len(err) == 1 and "a document of the input" in err[0], err
    assert "encoder" not in json.loads((tmp_path / "c" / "meta.json").read_text())


def test_a_parallel_builds_meta_records_the_encoder_each_task_ran(tiktoken_file, monkeypatch, tmp_path):
    """meta.json says which encoder made the cache from the tasks' receipts, not from the driver: tasks of a
    first run on the reference encoder, reused by a second run that has the fast encoder, are counted as such;
    a receipt that does not say which encoder ran is not reused."""
    from niels_gpt.builders.run import BuildSpec, build

    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in _docs()), encoding="utf-8")
    work = tmp_path / "work"

    def run(name: str) -> tuple[dict, dict, dict]:
        summary = build(BuildSpec(sources=[str(src)], out=str(tmp_path / name), tokenizer=str(tiktoken_file),
                                  executor="processes", workers=2, task_bytes=20_000, work_dir=str(work),
                                  keep_parts=True, progress=False), None)
        shards = {p.name: p.read_bytes() for p in sorted((tmp_path / name).rglob("shard_*"))}
        return summary, json.loads((tmp_path / name / "meta.json").read_text()), shards

    monkeypatch.setenv(ENV, "reference")
    summary, meta, reference_shards = run("reference")
    tasks = summary["tasks"]
    receipts = sorted((work / "parts").glob("*.json"))
    assert tasks >= 4 and len(receipts) == tasks and "encoder" not in meta
    assert {json.loads(p.read_text())["encoder"] for p in receipts} == {"reference"}

    monkeypatch.delenv(ENV)
    fast = f"gigatoken {fast_module._version()}"
    for p in receipts[::2]:  # these tasks run again, now on the fast encoder
        p.unlink()
    summary, meta, shards = run("mixed")
    rerun = len(receipts[::2])
    assert (summary["ran"], summary["reused"]) == (rerun, tasks - rerun)
    assert meta["encoder"] == fast and meta["encoder_tasks"] == {fast: rerun, "reference": tasks - rerun}
    assert shards == reference_shards

    stale = receipts[1]
    record = json.loads(stale.read_text())
    del record["encoder"]
    stale.write_text(json.dumps(record))
    summary, meta, shards = run("again")
    assert (summary["ran"], summary["reused"]) == (1, tasks - 1)
    assert meta["encoder_tasks"] == {fast: rerun + 1, "reference": tasks - rerun - 1} and shards == reference_shards


def _sft_build(src: Path, where: Path, tokenizer: str, executor: str) -> tuple[dict, dict]:
    from niels_gpt.builders.run import BuildSpec, build

    out = where / "c"  # one name: meta.json's dataset_name is the folder's
    build(BuildSpec(sources=[str(src)], out=str(out), tokenizer=tokenizer, chat=True, val_frac=0.1,
                    executor=executor, workers=2, task_bytes=1_024, progress=False), None)
    files = {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.name != "meta.json"}
    return files, json.loads((out / "meta.json").read_text())


@pytest.mark.parametrize("executor", ["inline", "processes"])
def test_an_sft_cache_rendered_by_the_fast_encoder_is_the_reference_cache(spm_bpe, tmp_path, executor, monkeypatch,
                                                                         capfd):
    """Chat rendering encodes each message with the fast encoder (the library's default kind: sentencepiece
    BPE): the same files as the tokenizer's own library writes, and meta.json names it."""
    chats = [{"messages": [{"role": "user", "content": f"What is {i} and {i}? {text[:200]}"},
                           {"role": "assistant", "content": f"{2 * i}, as {i} and {i} make. {text[-300:]}"}]}
             for i, text in enumerate(sample_texts() * 8)]
    src = tmp_path / "chats.jsonl"
    src.write_text("".join(json.dumps(c) + "\n" for c in chats), encoding="utf-8")
    assert fast_encoder(load_tokenizer(spm_bpe.model_path)) is not None
    files, meta = _sft_build(src, tmp_path / "fast", spm_bpe.model_path, executor)
    monkeypatch.setenv(ENV, "reference")
    ref_files, ref_meta = _sft_build(src, tmp_path / "ref", spm_bpe.model_path, executor)
    assert files == ref_files and meta["totals"]["val_examples"] > 0 and meta["totals"]["train_examples"] > 0
    assert meta["encoder"] == f"gigatoken {fast_module._version()}" and "encoder" not in ref_meta
    assert _without_encoder(meta) == _without_encoder(ref_meta)
    assert "warning" not in capfd.readouterr().err


def test_a_chat_build_whose_messages_the_fast_encoder_gets_wrong_uses_the_reference(spm_bpe, monkeypatch, capfd,
                                                                                    tmp_path):
    """The fast encoder is checked on the first conversations' messages (a parallel build: in each task); a
    mismatch puts the build on the tokenizer's own library with a warning, and meta.json names no fast encoder."""
    real = fast_module._build
    monkeypatch.setattr(fast_module, "_build", lambda g, tok: _Wrong(real(g, tok), "zebra"))
    chats = [{"messages": [{"role": "user", "content": f"Tell me about the zebra number {i}."},
                           {"role": "assistant", "content": f"Zebra {i} has stripes."}]} for i in range(30)]
    src = tmp_path / "chats.jsonl"
    src.write_text("".join(json.dumps(c) + "\n" for c in chats), encoding="utf-8")
    for executor in ("inline", "processes"):
        files, meta = _sft_build(src, tmp_path / executor, spm_bpe.model_path, executor)
        err = [line for line in capfd.readouterr().err.splitlines() if line.startswith("warning: the fast encoder")]
        assert err and all("a document of the input ('Tell me about the zebra" in line for line in err), err
        assert "encoder" not in meta
    monkeypatch.setenv(ENV, "reference")
    assert _sft_build(src, tmp_path / "ref", spm_bpe.model_path, "inline")[0] == files


def test_the_sentinel_rendering_is_render_chats_ids_with_either_encoder(spm_bpe):
    """`sentinel_rendering` with the fast encoder's message encoder gives render_chat's ids, on the check texts,
    the sample corpus and, where ../shared is here, real conversations (oasst1)."""
    from niels_gpt.tokenizer.fast import message_encoder

    texts = [t for t in fast_module.TORTURE if "\ud800" not in t] + sample_texts()  # sentencepiece: no lone surrogate
    oasst = SHARED_DATA / "oasst1" / "oasst_pre_release.en_100_tree.jsonl"
    if oasst.exists():
        texts += [json.loads(line)["prompt"]["text"] for line in oasst.read_text(encoding="utf-8").splitlines()]
    convs = [[{"role": "user", "content": a}, {"role": "assistant", "content": b}] for a, b in zip(texts[:-1], texts[1:], strict=True)]
    tok = load_tokenizer(spm_bpe.model_path)
    encode = message_encoder(tok, convs)
    assert encode is not None and len(convs) > 60
    for conv in convs:
        want = tok.render_chat(conv).ids
        assert tok.sentinel_rendering(conv, encode).tolist() == want == tok.sentinel_rendering(conv).tolist()


@needs_shared
def test_real_conversations_give_the_reference_sft_cache(spm_bpe, tmp_path, monkeypatch):
    """The 100 oasst1 trees and 34 dolly records of ../shared/data (real chats: a conversation a tree, a record),
    inline and on processes: the fast encoder's SFT caches are the reference's, file for file."""
    from niels_gpt.builders.run import BuildSpec, build

    sources = {"oasst": SHARED_DATA / "oasst1" / "oasst_pre_release.en_100_tree.jsonl",
               "dolly": SHARED_DATA / "dolly-15k" / "databricks-dolly-15k.first34.jsonl"}

    def files(encoder: str, layout: str, executor: str) -> dict:
        out = tmp_path / encoder / layout / executor / "c"
        build(BuildSpec(sources=[str(sources[layout])], out=str(out), tokenizer=spm_bpe.model_path, chat=True,
                        layout=layout, val_frac=0.1, executor=executor, workers=2, task_bytes=100_000,
                        progress=False), None)
        meta = json.loads((out / "meta.json").read_text())
        assert ("encoder" in meta) == (encoder == "fast") and meta["totals"]["train_examples"] > 20
        return {p.name: p.read_bytes() for p in out.iterdir() if p.name != "meta.json"}

    fast = {(layout, ex): files("fast", layout, ex) for layout in sources for ex in ("inline", "processes")}
    monkeypatch.setenv(ENV, "reference")
    for (layout, ex), got in fast.items():
        assert got == files("reference", layout, ex), (layout, ex)


def test_the_switch_interval_is_short_while_fast_encoder_threads_run_and_given_back_after(tiktoken_file):
    """The reading thread gives the GIL to an encode thread back from a GIL-free call within SWITCH_INTERVAL_S,
    not Python's 5 ms, while any pool of fast encoder threads runs; the last one to end gives back the interval
    there was (a user's own setting), and pools of the tokenizer's own library change nothing."""
    from niels_gpt.builders import encode_pool

    before = sys.getswitchinterval()
    sys.setswitchinterval(0.004)
    try:
        first = encode_pool.EncodePool(load_tokenizer(tiktoken_file), 2)
        assert first.batch and sys.getswitchinterval() == pytest.approx(encode_pool.SWITCH_INTERVAL_S, rel=0.02)
        second = encode_pool.EncodePool(load_tokenizer(tiktoken_file), 2)
        first.shutdown()
        assert sys.getswitchinterval() == pytest.approx(encode_pool.SWITCH_INTERVAL_S, rel=0.02)  # the second still runs
        second.shutdown()
        second.shutdown()  # twice: counted once
        assert sys.getswitchinterval() == pytest.approx(0.004, rel=0.02)
        sys.setswitchinterval(0.0001)  # already shorter: kept as it is
        third = encode_pool.EncodePool(load_tokenizer(tiktoken_file), 2)
        assert sys.getswitchinterval() == pytest.approx(0.0001, rel=0.02)
        third.shutdown()
        os.environ[ENV] = "reference"
        try:
            sys.setswitchinterval(0.004)
            own = encode_pool.EncodePool(load_tokenizer(tiktoken_file), 2)
            assert not own.batch and sys.getswitchinterval() == pytest.approx(0.004, rel=0.02)
            own.shutdown()
        finally:
            del os.environ[ENV]
    finally:
        sys.setswitchinterval(before)
