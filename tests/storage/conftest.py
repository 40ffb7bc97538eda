"""The storage servers and the download cache of tests/conftest.py; every test here gets its own download cache."""

from __future__ import annotations

import pytest

from ..conftest import CREDENTIALS, _QuietHandler, free_port, http_server  # noqa: F401  (imported from here by tests)


@pytest.fixture(autouse=True)
def own_download_cache(download_cache):
    """Each test downloads into its own local cache directory."""
    return download_cache
