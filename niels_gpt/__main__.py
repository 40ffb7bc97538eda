"""python -m niels_gpt COMMAND: the same commands as python -m niels_gpt.cli."""

import sys

from niels_gpt.cli import main

sys.exit(main())
