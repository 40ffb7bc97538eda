"""inspect, verify and stats of a cache at a URL (a real S3 endpoint): the same report as of the local
build, naming the URL; verify checks the bytes at the URL and names a damaged shard."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from niels_gpt.cache.cli import main
from niels_gpt.storage import upload_tree

from ..conftest import sample_texts


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def corpus_file(tmp_path):
    path = tmp_path / "in" / "docs.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in sample_texts()[:8]))
    return path


def build(capsys, src, out, tokenizer):
    rc, _, err = run(capsys, "build", str(src), "--out", str(out), "--tokenizer", str(tokenizer.model_path),
                     "--val-tokens", "2000", "--max-tokens", "30000", "--shard-bytes", "16KiB", "--name", "mine",
                     "--no-progress")
    assert rc == 0, err


def test_inspect_verify_and_stats_of_an_s3_cache_equal_the_local_ones(s3, tokenizer, tmp_path, corpus_file, capsys):
    _, bucket = s3
    url, local = f"{bucket}/caches/mine", tmp_path / "mine"
    build(capsys, corpus_file, local, tokenizer)
    build(capsys, corpus_file, url, tokenizer)
    tok = str(tokenizer.model_path)

    rc, want, _ = run(capsys, "inspect", str(local), "--tokenizer", tok)
    rc_url, got, _ = run(capsys, "inspect", url, "--tokenizer", tok)
    assert rc == rc_url == 0 and got == want.replace(str(local), url) and got.startswith(f"cache {url}\n")
    assert "tokens of train/shard_00000.bin:" in got

    want = json.loads(run(capsys, "inspect", str(local), "--json")[1])
    got = json.loads(run(capsys, "inspect", url, "--json")[1])
    assert got == {url: want[str(local)]}

    for extra in ([], ["--json"]):
        rc, want, _ = run(capsys, "stats", str(local), *extra)
        rc_url, got, _ = run(capsys, "stats", url, *extra)
        assert rc == rc_url == 0 and got == want.replace(str(local), url) and url in got
    rc, want, _ = run(capsys, "stats", str(local / "val"))
    assert run(capsys, "stats", f"{url}/val") == (0, want.replace(str(local), url), "")

    rc, out, _ = run(capsys, "verify", url)
    assert rc == 0 and out.splitlines() == [f"checked {url}: pretrain cache", "verify: 1 output(s), 0 problem(s)"]


def test_verify_of_a_url_names_a_damaged_shard(s3, tokenizer, tmp_path, corpus_file, capsys):
    fs, bucket = s3
    url = f"{bucket}/mine"
    build(capsys, corpus_file, url, tokenizer)
    assert run(capsys, "verify", url)[0] == 0  # the shards are now mirrored locally, and good
    shard = f"{url}/train/shard_00001.bin"
    data = bytearray(fs.cat_file(shard))
    data[10] ^= 0xFF
    fs.pipe_file(shard, bytes(data))  # same size, one byte flipped
    rc, out, _ = run(capsys, "verify", url)
    lines = out.splitlines()
    assert rc == 1 and lines[-1] == "verify: 1 output(s), 1 problem(s)"
    assert [ln for ln in lines if ln.startswith("MISMATCH")] == [
        ln for ln in lines if ln.startswith(f"MISMATCH {shard}: sha256 ") and "differs from meta.json" in ln]
    fs.rm_file(f"{url}/train/shard_00000.bin")
    rc, out, _ = run(capsys, "verify", url)
    assert rc == 1 and f"MISMATCH {url}/train/shard_00000.bin: listed in meta.json but missing remotely" in out
    assert "verify: 1 output(s), 2 problem(s)" in out
    # stats reads every shard: the damaged one is an error naming it
    rc, _, err = run(capsys, "stats", url)
    assert rc == 1 and err.startswith(f"error: {url}/train/shard_00000.bin: listed in meta.json but missing remotely")


def test_verify_of_a_url_names_a_file_its_meta_does_not_list(s3, tokenizer, tmp_path, corpus_file, capsys):
    fs, bucket = s3
    url = f"{bucket}/extra"
    build(capsys, corpus_file, url, tokenizer)
    fs.pipe_file(f"{url}/train/shard_00099.bin", b"\0\0")  # a leftover of another build
    rc, out, _ = run(capsys, "verify", url)
    assert rc == 1 and (f"MISMATCH {url}/train/shard_00099.bin: a file the meta.json does not list (a temporary of "
                        "a killed run or a leftover); remove it or rebuild") in out.splitlines()
    assert "verify: 1 output(s), 1 problem(s)" in out
    fs.rm_file(f"{url}/train/shard_00099.bin")
    assert run(capsys, "verify", url)[0] == 0


def test_a_url_without_a_cache_is_one_line(s3, capsys):
    _, bucket = s3
    for cmd in ("inspect", "verify", "stats"):
        rc, _, err = run(capsys, cmd, f"{bucket}/nothing")
        assert rc == 1 and err.startswith(f"error: no meta.json at {bucket}/nothing: ") and err.count("\n") == 1


def test_inspect_finds_the_tokenizer_beside_a_root_of_caches_at_a_url(s3, tokenizer, tmp_path, corpus_file, capsys):
    _, bucket = s3
    root = tmp_path / "root"
    build(capsys, corpus_file, root / "pretrain" / "mine", tokenizer)
    shutil.copytree(Path(tokenizer.model_path).parent, root / "tokenizer")
    upload_tree(root, f"{bucket}/root")
    rc, want, _ = run(capsys, "inspect", str(root / "pretrain" / "mine"))
    rc_url, got, err = run(capsys, "inspect", f"{bucket}/root/pretrain/mine")
    assert rc == rc_url == 0, err
    assert got == want.replace(str(root / "pretrain" / "mine"), f"{bucket}/root/pretrain/mine")


def test_verify_and_inspect_a_packed_directory_at_a_url(s3, tmp_path, capsys):
    fs, bucket = s3
    from ..conftest import SPECIALS, write_sft_cache

    u, a, e = SPECIALS["usr"], SPECIALS["asst"], SPECIALS["eot"]
    write_sft_cache(tmp_path / "sft", [[u, 10 + i, 11, a, 20 + i, 21, e] for i in range(40)])
    assert run(capsys, "pack-sft", str(tmp_path / "sft"), str(tmp_path / "packed"), "--pack-size", "32")[0] == 0
    upload_tree(tmp_path / "packed", f"{bucket}/packed")
    rc, out, err = run(capsys, "verify", f"{bucket}/packed")
    assert rc == 0, out + err
    assert out.splitlines()[0].startswith(f"checked {bucket}/packed: packed SFT bins")
    rc, want, _ = run(capsys, "stats", str(tmp_path / "packed"))
    assert run(capsys, "stats", f"{bucket}/packed") == (0, want.replace(str(tmp_path / "packed"), f"{bucket}/packed"), "")
