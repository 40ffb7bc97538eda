"""Temporaries of killed runs (`*.tmp-<pid>` of a process that no longer runs) are reported by verify and
removed by the next build of that output; a live writer's temporaries are left alone."""

import os
import subprocess
import sys

from niels_gpt.atomic import pid_alive, remove_stale_temporaries, stale_temporaries
from niels_gpt.cache.build_cache import build_pretrain_cache
from niels_gpt.formats.convert import convert
from niels_gpt.packing import pack_sft
from niels_gpt.report import verify_path

from .conftest import SPECIALS, write_sft_cache


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert not pid_alive(p.pid)
    return p.pid


def _build(out, tokenizer, docs):
    build_pretrain_cache(docs, str(out), tokenizer=tokenizer, max_train_tokens=10**6, max_val_tokens=0,
                         shard_bytes=1 << 20, seed=0, shuffle_buffer=None)


def test_only_dead_writers_temporaries_are_stale(tmp_path):
    dead, live = dead_pid(), os.getppid()
    (tmp_path / f"a.bin.tmp-{dead}").write_bytes(b"x")
    (tmp_path / f"b.bin.tmp-{live}").write_bytes(b"x")
    (tmp_path / "c.bin").write_bytes(b"x")
    assert [p.name for p in stale_temporaries(tmp_path)] == [f"a.bin.tmp-{dead}"]
    remove_stale_temporaries(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"b.bin.tmp-{live}", "c.bin"]


def test_verify_reports_a_killed_builds_temporary_and_a_rebuild_removes_it(tmp_path, tokenizer, real_docs):
    out = tmp_path / "c"
    _build(out, tokenizer, real_docs[:5])
    left = out / "train" / f"shard_00001.bin.tmp-{dead_pid()}"
    left.write_bytes(b"\0" * 64)
    problems, _ = verify_path(str(out))
    assert len(problems) == 1 and "a file the meta.json does not list" in problems[0] and left.name in problems[0]
    _build(out, tokenizer, real_docs[:5])
    assert not left.exists() and verify_path(str(out)) == ([], 1)


def test_pack_sft_and_convert_remove_what_killed_runs_left(tmp_path, tokenizer, real_docs):
    a, e = SPECIALS["asst"], SPECIALS["eot"]
    sft = write_sft_cache(tmp_path / "sft", [[SPECIALS["usr"], 7, a, 8, e]] * 4)
    packed = tmp_path / "packed"
    pack_sft(str(sft), str(packed), pack_size=16)
    left = packed / f"input_ids.npy.tmp-{dead_pid()}"
    left.write_bytes(b"junk")
    assert any("does not list" in p for p in verify_path(str(packed))[0])
    pack_sft(str(sft), str(packed), pack_size=16)
    assert not left.exists() and verify_path(str(packed)) == ([], 1)

    cache = tmp_path / "cache"
    _build(cache, tokenizer, real_docs[:5])
    beside = tmp_path / f"out.tmp-{dead_pid()}"
    (beside / "train").mkdir(parents=True)
    (beside / "train" / "shard_00000.npy").write_bytes(b"partial")
    convert(cache, tmp_path / "out", to="kempner-npy")
    assert not beside.exists() and (tmp_path / "out").is_dir()
