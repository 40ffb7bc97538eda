"""A mirrored copy is checked before a process first serves it (size always, sha256 once per host, remembered in
a stamp): a byte flipped in the download cache is found, named in one warning line and fetched again, and
`verify` of the URL reports it as a problem it healed."""

from __future__ import annotations

import numpy as np

from niels_gpt.cache.cli import main
from niels_gpt.storage import RemoteCache, mirror

from ..conftest import write_pretrain_cache

REL = "train/shard_00000.bin"


def _served(tmp_path, counting_server):
    cache = write_pretrain_cache(tmp_path / "c", {"train": [np.arange(4000) % 2000], "val": [np.arange(100)]})
    return cache, counting_server(cache)


def _flip(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x40
    path.write_bytes(bytes(data))


def test_a_byte_flipped_in_the_download_cache_is_fetched_again_and_named(tmp_path, counting_server, capsys):
    cache, server = _served(tmp_path, counting_server)
    local = RemoteCache(server.url).fetch(REL)
    _flip(local)
    rc = RemoteCache(server.url)  # a later run
    assert rc.fetch(REL).read_bytes() == (cache / REL).read_bytes()
    assert server.shard_gets() == {"shard_00000.bin": 2}
    [line] = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert line.startswith("warning: ") and f"{server.url}/{REL}" in line and str(local) in line
    assert "sha256" in line and "fetching it again" in line
    assert rc.healed == [line[len("warning: "):]]


def test_a_copy_of_the_wrong_size_is_fetched_again(tmp_path, counting_server, capsys):
    cache, server = _served(tmp_path, counting_server)
    local = RemoteCache(server.url).fetch(REL)
    with open(local, "ab") as f:
        f.write(b"\0\0")
    assert RemoteCache(server.url).fetch(REL).read_bytes() == (cache / REL).read_bytes()
    assert "has 8002 bytes, the record says 8000" in capsys.readouterr().err


def test_each_copy_is_hashed_once_per_host(tmp_path, counting_server, monkeypatch):
    _, server = _served(tmp_path, counting_server)
    RemoteCache(server.url).fetch(REL)  # the download hashes it and writes its stamp
    mirror._trusted.clear()  # as a new process finds it

    def no_hashing(path):
        raise AssertionError(f"hashed {path} again")

    monkeypatch.setattr(mirror, "sha256_file", no_hashing)
    assert RemoteCache(server.url).fetch(REL).is_file()
    assert server.shard_gets() == {"shard_00000.bin": 1}


def test_verify_reports_a_damaged_copy_it_healed(tmp_path, counting_server, capsys):
    _, server = _served(tmp_path, counting_server)
    local = RemoteCache(server.url).fetch(REL)
    _flip(local)
    capsys.readouterr()
    assert main(["verify", server.url]) == 1
    out = capsys.readouterr().out
    [line] = [x for x in out.splitlines() if x.startswith("MISMATCH")]
    assert f"{server.url}/{REL}" in line and "healed" in line and "local copy" in line
    assert main(["verify", server.url]) == 0  # healed: the next verify finds nothing
