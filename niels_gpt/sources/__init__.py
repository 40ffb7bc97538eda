"""The input layer: files, directories, globs, URLs and dataset ids read as documents or conversations.

    from niels_gpt.sources import SAMPLE_DIR
    from niels_gpt.sources.corpus import corpus
    docs = corpus([SAMPLE_DIR / "wikitext" / "wiki.train.raw"], layout="wikitext").iter_texts()

inputs.py expands the names, records.py reads every kind, documents.py applies the text rules and layouts,
stream.py orders the pieces, named.py is build-all's table of named sources. Nothing heavy is imported here.
"""

from __future__ import annotations

from niels_gpt.sources.base import SAMPLE_DIR

__all__ = ["SAMPLE_DIR"]
