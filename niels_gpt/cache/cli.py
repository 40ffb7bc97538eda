"""The command line: this contract path (`python -m niels_gpt.cache.cli build-all ...`) runs `niels_gpt.cli`."""

from niels_gpt.args import exit_with
from niels_gpt.cli import *  # noqa: F403
from niels_gpt.cli import main

if __name__ == "__main__":
    exit_with(main())
