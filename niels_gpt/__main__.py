"""python -m niels_gpt COMMAND, and the niels-gpt-data script: the commands of niels_gpt.cli, numpy's BLAS threads
kept from spinning for the commands that multiply no matrices (args.quiet_blas)."""

import sys

from niels_gpt.args import exit_with, quiet_blas


def run() -> None:
    quiet_blas(sys.argv[1:])
    from niels_gpt.cli import main  # lazy: after quiet_blas, as it imports numpy

    exit_with(main())


if __name__ == "__main__":
    run()
