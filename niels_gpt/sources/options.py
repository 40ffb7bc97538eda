"""How a source describes its own settings, so that build-all, its flags and its config need no
knowledge of any one source: a new source is one module with a `SourceConfig` and one line in
`niels_gpt.sources.CONFIGS`.

    SourceConfig("roam", "pretrain", "local directories", options=(Option("roam_dir", None, "..."), ...),
                 make=lambda v, seed: roam(v["roam_dir"], val_frac=v["roam_val_frac"], seed=seed),
                 local=("roam_dir",))

Each `Option` is one field of `build_all.BuildConfig` and one flag of build-all / train-tokenizer
(`--roam-dir` for `roam_dir`). `make` turns the option values into the source; `local` names the
options that point at the user's own data, which take the place of the bundled sample with --sample.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class Option:
    field: str  # the BuildConfig field; the flag is --field-with-dashes
    default: Any
    help: str
    type: Callable[[str], Any] | None = None
    nargs: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.field.replace("_", "-")

    def add_to(self, group, default: Any) -> None:
        kwargs: dict[str, Any] = {"default": default, "help": self.help}
        if self.type is not None:
            kwargs["type"] = self.type
        if self.nargs is not None:
            kwargs["nargs"] = self.nargs
        group.add_argument(self.flag, **kwargs)


@dataclass(frozen=True)
class SourceConfig:
    name: str
    kind: Literal["pretrain", "sft"]
    title: str  # the --help group its flags are listed under
    options: tuple[Option, ...]
    make: Callable[[Mapping[str, Any], int], Any]  # (option values, seed) -> the source, or None: skip it
    local: tuple[str, ...] = ()  # options naming the user's own data (these replace the sample corpus)

    def values(self, config: Any) -> dict[str, Any]:
        """This source's option values, read from a BuildConfig (or anything with the same fields)."""
        return {o.field: getattr(config, o.field) for o in self.options}

    def has_local_data(self, values: Mapping[str, Any]) -> bool:
        return any(values[f] is not None for f in self.local)
