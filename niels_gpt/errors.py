"""The package's exceptions: one base class, a few specific kinds.

Every message names the file or record, what was wrong and how to fix it.
"""


class NielsGPTError(Exception):
    """Base class of every error this package raises on purpose."""


class ConfigError(NielsGPTError, ValueError):
    """A bad argument, flag or configuration value."""


class SourceError(NielsGPTError):
    """A corpus source could not be read: missing directory, bad file, bad record."""


class TokenizerError(NielsGPTError):
    """A tokenizer could not be trained, loaded or used as asked."""


class CacheError(NielsGPTError):
    """A token cache is unusable."""


class IncompleteCacheError(CacheError):
    """A cache directory has no meta.json: its build never finished."""


class FormatError(NielsGPTError):
    """A token file's header or layout is invalid, or its format is ambiguous."""


class CacheMismatchError(CacheError, FormatError):
    """A cache's files disagree with its meta.json (size, token count, sha256, a stray or missing file);
    found by a reader (a CacheError) or format detection (a FormatError)."""


class TokenRangeError(CacheError, FormatError):
    """A token id does not fit the dtype being written (uint16 above 65,535), in a build or a conversion."""


class StateError(NielsGPTError):
    """A resume state does not belong to this dataset or loader."""


class OutputLockedError(NielsGPTError):
    """Another build holds the lock of the output this one would write."""


class OutOfSpaceError(NielsGPTError):
    """The disk filled up (or a quota was reached) while writing an output; the partial output is removed."""

    def __init__(self, errno: int, message: str):
        super().__init__(message)
        self.errno = errno


class StorageError(NielsGPTError):
    """A remote store (s3://, gs://, hf://, http(s)://) failed to serve or accept a file, after retries."""


def first_few(items: list[str], n: int = 3, more: str = ", ...") -> str:
    """The first `n` of `items`, comma-separated, then `more` if there are others: a message's short list."""
    return ", ".join(items[:n]) + (more if len(items) > n else "")
