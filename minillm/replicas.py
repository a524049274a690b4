"""`python -m minillm.replicas`: servers behind vllm-router, from minillm.entrypoints.replicas (chapter 15)."""

import sys

from minillm.entrypoints.replicas import main

if __name__ == "__main__":
    sys.exit(main())
