"""The outputs below a path (caches, tokenizers, unfinished and interrupted builds); a cache's tokenizer."""

from __future__ import annotations

from pathlib import Path

from niels_gpt.constants import META_NAME
from niels_gpt.errors import NielsGPTError, TokenizerError
from niels_gpt.locate import locate
from niels_gpt.markers import unfinished_tokens
from niels_gpt.meta import staged_output, unfinished_build
from niels_gpt.tokenizer.find import tokenizer_of


def find_caches(path: Path) -> list[Path]:
    """Every directory with a meta.json at or below `path`: caches and tokenizer directories."""
    path = Path(path)
    if (path / META_NAME).is_file():
        return [path]
    return sorted(p.parent for p in path.rglob(META_NAME))


def unfinished_dirs(path: Path) -> list[Path]:
    """Directories holding token files of ours but no commit marker: builds that never committed (a directory
    a peer format's reader recognises, a `convert` output, is a finished output of its own)."""
    out = []
    for d in [Path(path), *[p for p in Path(path).rglob("*") if p.is_dir()]]:
        if not unfinished_tokens(d):
            continue
        if (staged := staged_output(d)) is not None and unfinished_build(staged) is not None:
            continue  # an interrupted build of an output that is not there: `interrupted_builds` names it
        try:
            foreign = locate(d).kind == "foreign"
        except NielsGPTError:
            foreign = False
        if (d / "input_ids.npy").is_file() or not foreign:
            out.append(d)
    return out


def interrupted_builds(path: Path) -> list[str]:
    """One line per output at or below `path` whose first build was interrupted (meta.unfinished_build)."""
    path = Path(path)
    candidates = [path] if not path.exists() else [path, *(p for p in path.rglob("*") if p.is_dir())]
    outs = {staged_output(p) or p for p in candidates}
    return [msg for out in sorted(outs) if (msg := unfinished_build(out)) is not None]


def find_tokenizer(cache: Path, meta: dict, explicit: str | None = None):
    """The cache's tokenizer by the one rule (niels_gpt/tokenizer/find.py), or an error saying what to pass."""
    if (tok := tokenizer_of(cache, explicit)) is None:
        raise TokenizerError(f"no tokenizer with sha256 {str(meta.get('tokenizer_sha256'))[:16]}… found: not at the "
                             f"path {cache / META_NAME} records, nor in a tokenizer/ directory above {cache}: pass "
                             "--tokenizer PATH")
    return tok

