"""Build glue for the one optional C extension; all metadata lives in pyproject.toml.

niels_gpt._native._gather (niels_gpt/_native/gather.c) is built where a C compiler and the Python
headers exist. It is `optional`: when it fails to compile, setuptools prints a warning and the install
goes on, and the readers use their numpy path (niels_gpt/_native/__init__.py).
"""

import sys

from setuptools import Extension, setup

COMPILE_ARGS = [] if sys.platform == "win32" else ["-O3"]

setup(ext_modules=[Extension("niels_gpt._native._gather", ["niels_gpt/_native/gather.c"],
                             extra_compile_args=COMPILE_ARGS, optional=True)])
