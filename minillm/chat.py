"""`python -m minillm.chat` (and `make chat`): the terminal chat of minillm.entrypoints.chat."""

import sys

from minillm.entrypoints.chat import main

if __name__ == "__main__":
    sys.exit(main())
