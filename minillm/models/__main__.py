"""python -m minillm.models list | get ID: the hub ids minillm obtains offline, and their checkpoint directories.

`get` converts the checkpoint if it is not in the cache yet and prints its directory as the last line, so a
script can take it: `DIR=$(python -m minillm.models get HuggingFaceTB/SmolLM2-135M-Instruct | tail -1)`.
"""

import argparse
import sys

from minillm.models.hub import KNOWN_MODELS, get_model, known_models


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minillm.models", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the known hub ids: installed? converted? where")
    get = sub.add_parser("get", help="convert (once) and print the checkpoint directory")
    get.add_argument("id", help=" or ".join(KNOWN_MODELS))
    args = parser.parse_args(argv)
    if args.command == "list":
        for row in known_models():
            state = "converted" if row["converted"] else "installed" if row["installed"] else "not installed"
            print(f"{row['id']:40s} {state:14s} package {row['package']}, cache {row['path']}")
        return 0
    if args.id not in KNOWN_MODELS:
        print(f"unknown model {args.id!r}: known are {', '.join(KNOWN_MODELS)}", file=sys.stderr)
        return 2
    try:
        print(get_model(args.id))
    except FileNotFoundError as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
