"""Run every benchmark in this directory, one after the other (`make bench`).

Each script prints its own table of ratios against the peers measured in the same run.
"""

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    failed = []
    for script in sorted(HERE.glob("bench_*.py")):
        if script.name == "bench_cache_common.py":
            continue
        print(f"\n===== {script.name} =====", flush=True)
        if subprocess.run([sys.executable, str(script)]).returncode:
            failed.append(script.name)
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
