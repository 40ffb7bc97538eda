"""`build` reads sources at URLs (a real S3 endpoint, a real HTTP server, memory://): the cache is the one
the same files give from local paths, byte for byte; a missing URL, an unusable scheme and a bad record are
one clear error naming the URL."""

from __future__ import annotations

import json

import pytest

from niels_gpt.builders.run import BuildSpec, build
from niels_gpt.cache.cli import main
from niels_gpt.cache.meta import read_meta
from niels_gpt.errors import ConfigError, SourceError
from niels_gpt.sources.corpus import corpus
from niels_gpt.tokenizer import load_tokenizer

from ..conftest import http_server


def build_meta(sources, out, **kw):
    """`build` (inline, one encode worker unless given) into `out`; returns the cache's meta.json."""
    build(BuildSpec(sources=list(sources), out=str(out), **{"executor": "inline", "workers": 1, **kw}),
          log=lambda msg: None)
    return read_meta(str(out))

pytest.importorskip("tokenizers")


def tree(out) -> dict[str, bytes]:
    """Every file of a cache; meta.json without its record of the source (which names the paths read)."""
    files = {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    meta = json.loads(files.pop("meta.json"))
    source = meta.pop("source")
    meta.pop("record_sha256")  # the record's checksum covers the source too
    files.pop("origins.json", None)  # the inputs of the origins: their paths, and a URL's version for a sha256
    meta.get("files", {}).pop("origins.json", None)
    source["skipped_inputs"] = [e["path"].rsplit("/", 1)[-1] for e in meta.pop("skipped_inputs", [])]
    files["meta.json"] = json.dumps(meta, sort_keys=True).encode()
    return files, source


def local_build(d, names, out, tok, **kw):
    return build_meta([d / n for n in names] if names else [d], str(out), tokenizer=tok, name="same",
                        val_tokens=200, shard_bytes=1024, **kw)


def upload(fs, d, prefix):
    for p in sorted(d.iterdir()):
        fs.put_file(str(p), f"{prefix}/{p.name}")


def test_s3_prefix_files_and_glob_build_the_local_cache(s3, tmp_path, corpus_dir, bpe_json):
    fs, bucket = s3
    d, _ = corpus_dir
    tok = load_tokenizer(bpe_json)
    upload(fs, d, f"{bucket}/corpus")
    local_build(d, None, tmp_path / "local", tok)
    want, want_src = tree(tmp_path / "local")
    assert len([k for k in want if k.startswith("train/")]) >= 3

    # the prefix stands for its files like the directory (dot-files left out, same order)
    assert main(["build", f"{bucket}/corpus/", "--out", str(tmp_path / "prefix"), "--tokenizer", str(bpe_json),
                 "--name", "same", "--val-tokens", "200", "--shard-bytes", "1KiB", "--no-progress"]) == 0
    got, src = tree(tmp_path / "prefix")
    assert got == want
    names = sorted(p.name for p in d.iterdir() if not p.name.startswith("."))
    assert src["files"] == [f"{bucket}/corpus/{n}" for n in names] and len(names) == len(want_src["files"])
    assert src["skipped_inputs"] == want_src["skipped_inputs"] == [".hidden.jsonl"]  # listed, on both

    # every file given by its URL
    local_build(d, names, tmp_path / "local-files", tok)
    build_meta([f"{bucket}/corpus/{n}" for n in names], str(tmp_path / "files"), tokenizer=tok, name="same",
                 val_tokens=200, shard_bytes=1024)
    assert tree(tmp_path / "files")[0] == tree(tmp_path / "local-files")[0]

    # a glob expands in the order of a local glob
    build_meta([f"{bucket}/corpus/*.json*"], str(tmp_path / "glob"), tokenizer=tok, name="same")
    build_meta([str(d / "*.json*")], str(tmp_path / "local-glob"), tokenizer=tok, name="same")
    got, src = tree(tmp_path / "glob")
    assert got == tree(tmp_path / "local-glob")[0]
    assert src["files"] == [f"{bucket}/corpus/{n}" for n in ("a.jsonl", "b.json.gz", "c.jsonl.zst")]


def test_an_http_url_per_file_builds_the_local_cache(tmp_path, corpus_dir, bpe_json):
    d, _ = corpus_dir
    tok = load_tokenizer(bpe_json)
    names = ["f.arrow", "a.jsonl", "e.parquet", "b.json.gz", "d.csv", "c.jsonl.zst", "g.md"]
    local_build(d, names, tmp_path / "local", tok)
    with http_server(d) as base:
        build_meta([f"{base}/{n}" for n in names], str(tmp_path / "http"), tokenizer=tok, name="same",
                     val_tokens=200, shard_bytes=1024)
        plain = [f"{base}/a.jsonl", f"{base}/g.md"]
        assert corpus(plain).input_bytes() == sum((d / n).stat().st_size for n in ("a.jsonl", "g.md"))
        with pytest.raises(SourceError, match=rf"^{base}/nothing\.jsonl: no such file or directory at this URL"):
            build_meta([f"{base}/nothing.jsonl"], str(tmp_path / "x"), tokenizer=tok)
    assert tree(tmp_path / "http")[0] == tree(tmp_path / "local")[0]


def test_memory_urls_build_the_local_cache(tmp_path, corpus_dir, bpe_json):
    import fsspec

    d, _ = corpus_dir
    tok = load_tokenizer(bpe_json)
    fs = fsspec.filesystem("memory")
    upload(fs, d, "/build-test/corpus")
    try:
        local_build(d, None, tmp_path / "local", tok)
        build_meta(["memory://build-test/corpus"], str(tmp_path / "mem"), tokenizer=tok, name="same",
                     val_tokens=200, shard_bytes=1024)
        assert tree(tmp_path / "mem")[0] == tree(tmp_path / "local")[0]
        # file:// is the local path it names: the same cache, the same record of the source
        build_meta([f"file://{d}"], str(tmp_path / "file"), tokenizer=tok, name="same", val_tokens=200,
                     shard_bytes=1024)
        assert tree(tmp_path / "file") == tree(tmp_path / "local")
    finally:
        fs.rm("/build-test", recursive=True)


def test_a_missing_url_is_named(s3, tmp_path, bpe_json, capsys):
    fs, bucket = s3
    tok = load_tokenizer(bpe_json)
    with pytest.raises(SourceError, match=rf"^{bucket}/nope/a\.jsonl: no such file or directory at this URL"):
        build_meta([f"{bucket}/nope/a.jsonl"], str(tmp_path / "c"), tokenizer=tok)
    for missing in ("s3://no-such-bucket-here/a.jsonl", "s3://no-such-bucket-here/dir"):
        with pytest.raises(SourceError, match=rf"^{missing}: no such file or directory at this URL"):
            build_meta([missing], str(tmp_path / "c"), tokenizer=tok)
    with pytest.raises(SourceError, match=r"^s3://no-such-bucket-here/\*\.jsonl: this glob matches no file"):
        build_meta(["s3://no-such-bucket-here/*.jsonl"], str(tmp_path / "c"), tokenizer=tok)
    fs.pipe_file(f"{bucket}/d/x.jsonl", b'{"text": "a"}\n')
    with pytest.raises(SourceError, match=rf"^{bucket}/d/\*\.parquet: this glob matches no file of a known kind"):
        build_meta([f"{bucket}/d/*.parquet"], str(tmp_path / "c"), tokenizer=tok)
    assert main(["build", f"{bucket}/d/y.jsonl", "--out", str(tmp_path / "c"), "--tokenizer", str(bpe_json)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {bucket}/d/y.jsonl: no such file") and "\n" not in err
    assert not (tmp_path / "c").exists()


def test_an_unusable_scheme_is_one_line_naming_what_to_do(tmp_path, bpe_json, capsys):
    tok = load_tokenizer(bpe_json)
    with pytest.raises(ConfigError, match=r"ftp2://host/a\.jsonl: the URL scheme 'ftp2' is not supported; use one of"):
        build_meta(["ftp2://host/a.jsonl"], str(tmp_path / "c"), tokenizer=tok)
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        assert main(["build", "gs://bucket/a.jsonl", "--out", str(tmp_path / "c"), "--tokenizer", str(bpe_json)]) == 1
        err = capsys.readouterr().err.strip()
        assert "gs:// backend is not installed" in err and "pip install 'niels_gpt[gcs]'" in err and "\n" not in err


def test_a_bad_record_at_a_url_is_named_by_url_and_line(s3, tmp_path, bpe_json):
    fs, bucket = s3
    tok = load_tokenizer(bpe_json)
    fs.pipe_file(f"{bucket}/in/a.jsonl", (json.dumps({"text": "fine"}) + "\n\n{broken\n").encode())
    with pytest.raises(SourceError, match=rf"^{bucket}/in/a\.jsonl, line 3: not valid JSON .*--on-bad-record skip"):
        build_meta([f"{bucket}/in"], str(tmp_path / "c"), tokenizer=tok)
    fs.pipe_file(f"{bucket}/in/b.md", b"ok \xff\n")
    with pytest.raises(SourceError, match=rf"{bucket}/in/b\.md.*byte 3, line 1"):
        build_meta([f"{bucket}/in/b.md"], str(tmp_path / "c"), tokenizer=tok)
    meta = build_meta([f"{bucket}/in/a.jsonl"], str(tmp_path / "c"), tokenizer=tok, on_bad_record="skip")
    assert meta["skipped"]["invalid_json"] == 1 and meta["totals"]["train_documents"] == 1
