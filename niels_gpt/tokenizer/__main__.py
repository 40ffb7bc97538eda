"""python -m niels_gpt.tokenizer [flags]: train the tokenizer (the `train-tokenizer` command)."""

import sys

from niels_gpt.cli import main

sys.exit(main(["train-tokenizer", *sys.argv[1:]]))
