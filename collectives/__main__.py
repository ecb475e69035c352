"""``python -m collectives``; see ``python -m collectives --help``."""

import sys

from collectives._cli import main
from collectives._kernels import exit_now_if_wedged

if __name__ == "__main__":
    # a kernel stopped while it held every XLA:CPU thread would make
    # Python's own exit abort: end the process directly then
    sys.exit(exit_now_if_wedged(main()))
