"""`python -m minillm.serve`: the OpenAI-compatible server of minillm.entrypoints.openai.api_server."""

import sys

from minillm.entrypoints.openai.api_server import main

if __name__ == "__main__":
    sys.exit(main())
