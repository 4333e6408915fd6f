"""``python -m pycoll.info [--json] [--algorithms -n N [--nodes K | --ranks-per-node L]]``"""
import sys

from pycoll.info import main

if __name__ == "__main__":
    sys.exit(main())
