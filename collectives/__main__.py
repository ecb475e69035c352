"""``python -m collectives``; see ``python -m collectives --help``."""

import sys

from collectives._cli import main

if __name__ == "__main__":
    sys.exit(main())
