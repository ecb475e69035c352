"""``python -m collectives.distributed TARGET...``: one worker of a launch."""

import sys

from collectives.distributed._worker import main

if __name__ == "__main__":
    sys.exit(main())
