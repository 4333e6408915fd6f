"""``python -m pycoll.bench <collective> [options]``"""
import sys

from pycoll.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
