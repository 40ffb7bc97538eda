"""Bad-input catalogue: the download cache of caches at URLs (--local-cache, its pins and locks) and the network
time limit (--network-timeout). Each case is checked by check_case (one error line naming what, where and how to
fix it; nothing complete-looking left behind)."""

from __future__ import annotations

import os
import uuid

import pytest

from niels_gpt.storage import reset, upload_tree
from niels_gpt.storage.local_cache import OWN_MARK

from .test_bad_input_catalogue import Case, check_case, world  # noqa: F401  (world: a fixture)

SMALL = ["--depth", "1", "--n-embd", "32", "--n-head", "2", "--sequence-len", "32", "--device-batch-size", "2",
         "--steps", "2", "--eval-steps", "1"]


def _url(w) -> str:
    """The pretraining cache at a fresh memory:// URL (this process's in-memory store)."""
    url = f"memory://b-{uuid.uuid4().hex[:12]}/c"
    upload_tree(w.pretrain, url)
    return url


def _train(w, tmp, downloads, *extra):
    return ["train", _url(w), "--out-dir", str(tmp / "run"), "--local-cache", str(downloads), *extra, *SMALL]


def train_local_cache_with_someone_elses_files(w, tmp):
    photos = tmp / "mine" / "remote" / "photos"
    photos.mkdir(parents=True)
    for i in range(3):
        (photos / f"p{i}.jpg").write_bytes(b"\xff\xd8" + bytes(1000))
    return _train(w, tmp, tmp / "mine", "--cache-limit", "1500")


def train_local_cache_is_a_file(w, tmp):
    (tmp / "downloads").write_text("my notes\n")
    return _train(w, tmp, tmp / "downloads")


def _own_download_cache(tmp):
    """An empty download cache of this library's, as an earlier run left it."""
    d = tmp / "downloads"
    d.mkdir()
    (d / OWN_MARK).write_bytes(b"")
    return d


def train_pin_file_not_utf8(w, tmp):
    d = _own_download_cache(tmp)
    (d / "pins").mkdir()
    (d / "pins" / f"{os.getppid()}-999999.txt").write_bytes(b"\xff\xfe/remote/\x80")
    return _train(w, tmp, d)


def train_lock_is_a_directory(w, tmp):
    d = _own_download_cache(tmp)
    (d / ".lock").mkdir()
    return _train(w, tmp, d)


def _timeout(value):
    def make(w, tmp):
        return ["--network-timeout", value, "verify", str(w.pretrain)]
    make.__name__ = f"network_timeout_{value}"
    return make


def verify_network_timeout_inf_after_the_command(w, tmp):
    return ["verify", str(w.pretrain), "--network-timeout", "inf"]


CASES = [
    Case("train: --local-cache holding someone else's files", train_local_cache_with_someone_elses_files,
         ("--local-cache", "mine", "not a download cache", "remote", "new or empty directory"), out="run"),
    Case("train: --local-cache that is a file", train_local_cache_is_a_file,
         ("--local-cache", "downloads", "a file, not a directory", "choose another path"), out="run"),
    Case("train: a pin file of the download cache that is not UTF-8", train_pin_file_not_utf8,
         ("-999999.txt", "pin file", "not UTF-8", "remove"), out="run"),
    Case("train: the download cache's .lock is a directory", train_lock_is_a_directory,
         ("downloads/.lock", "a directory where the download cache keeps a lock file", "rmdir"), out="run"),
    *[Case(f"--network-timeout {v}", _timeout(v), (f"--network-timeout {v}", "positive number of seconds", "finite",
                                                   "--network-timeout 120"), reads=("pretrain",))
      for v in ("inf", "nan", "0", "-5")],
    Case("verify: --network-timeout inf after the command", verify_network_timeout_inf_after_the_command,
         ("--network-timeout inf", "finite"), reads=("pretrain",)),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_one_clear_line(case, world, tmp_path, capsys):  # noqa: F811  (world: the fixture)
    try:
        check_case(case, world, tmp_path, capsys)
    finally:
        reset()  # --local-cache and --network-timeout set this process's settings: back to the defaults
    if case.make is train_local_cache_with_someone_elses_files:
        assert sorted(os.listdir(tmp_path / "mine" / "remote" / "photos")) == ["p0.jpg", "p1.jpg", "p2.jpg"]
        assert sorted(os.listdir(tmp_path / "mine")) == ["remote"]
    if case.make is train_local_cache_is_a_file:
        assert (tmp_path / "downloads").read_text() == "my notes\n"


def test_network_timeout_is_accepted_after_the_command(world, capsys, monkeypatch):  # noqa: F811  (world: the fixture)
    import niels_gpt.cli as cli
    from niels_gpt.cache.cli import main
    from niels_gpt.storage.settings import network_timeout_s

    seen = []  # the limit in force while the command runs (main hands the process's settings back after)
    real = cli.configure
    monkeypatch.setattr(cli, "configure", lambda **kw: (real(**kw), seen.append(network_timeout_s())))
    try:
        assert main(["verify", str(world.pretrain), "--network-timeout", "7.5"]) == 0
        assert seen == [7.5]
    finally:
        reset()
