"""python -m niels_gpt COMMAND: the same commands as python -m niels_gpt.cli."""

from niels_gpt.args import exit_with
from niels_gpt.cli import main

exit_with(main())
