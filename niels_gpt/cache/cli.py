"""The command line: this contract path (`python -m niels_gpt.cache.cli build-all ...`) runs `niels_gpt.cli`."""

import sys

from niels_gpt.args import exit_with, quiet_blas

if __name__ == "__main__":  # run as a program: before numpy is loaded (args.quiet_blas)
    quiet_blas(sys.argv[1:])

from niels_gpt.cli import *  # noqa: F403, E402
from niels_gpt.cli import main  # noqa: E402

if __name__ == "__main__":
    exit_with(main())
