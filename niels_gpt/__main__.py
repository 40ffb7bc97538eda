"""python -m niels_gpt COMMAND: the same commands as python -m niels_gpt.cache.cli."""

import sys

from niels_gpt.cache.cli import main

sys.exit(main())
