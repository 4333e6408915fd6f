"""``python -m pycoll.run -n N script.py [args...]`` (or ``-m module``): see docs/launcher.md."""

import sys

from pycoll.launch.cli import main

if __name__ == "__main__":
    sys.exit(main())
