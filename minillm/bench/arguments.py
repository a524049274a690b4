"""What every `python -m minillm.bench` command line shares (the offline bench, `serve`, `spec`, `quant`): argparse
types, the workloads' length options and the requests they make, and the warm-up's size."""

import argparse

from minillm.bench import workloads
from minillm.bench.workloads import Workload

WARMUP_PROMPTS, WARMUP_OUTPUT_LEN = 4, 16


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def non_negative_int(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return int(text)


def one_of(choices):
    """An argparse type: one name of `choices` (argparse's own choices=, for a value inside a list)."""

    def parse(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(choices)}, got {text!r}")
        return text

    return parse


def value_list(parse):
    """An argparse type: comma-separated values, each read by the argparse type `parse`, repeats dropped: the values
    a search tries, e.g. value_list(positive_int)("8,32,128") == [8, 32, 128]."""

    def parse_list(text: str) -> list:
        values = [parse(value.strip()) for value in text.split(",") if value.strip()]
        if not values:
            raise argparse.ArgumentTypeError(f"expected comma-separated values, got {text!r}")
        return list(dict.fromkeys(values))

    return parse_list


def length_range(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition(":")
    if not (sep and lo.isdigit() and hi.isdigit() and 1 <= int(lo) <= int(hi)):
        raise argparse.ArgumentTypeError(f"expected MIN:MAX with 1 <= MIN <= MAX, got {text!r}")
    return int(lo), int(hi)


def names_from(choices, what: str = "name"):
    """An argparse type: a comma-separated list of names, each one of `choices`."""

    def parse(text: str) -> list[str]:
        names = [name.strip() for name in text.split(",") if name.strip()]
        unknown = [name for name in names if name not in choices]
        if unknown or not names:
            raise argparse.ArgumentTypeError(
                f"unknown {what}(s) {', '.join(unknown) or repr(text)}; choose from {', '.join(choices)}"
            )
        return names

    return parse


def rate_list(text: str) -> list[float]:
    try:
        rates = [float(r) for r in text.split(",")]
    except ValueError:
        rates = []
    if not rates or not all(r > 0 for r in rates):
        raise argparse.ArgumentTypeError(f"expected comma-separated request rates > 0 (or inf), got {text!r}")
    return rates


def add_length_arguments(group) -> list[argparse.Action]:
    """The workloads' length options (make_workload reads them) and --seed; `python -m minillm.bench serve` has
    them too. The options added (their actions)."""
    n, lengths = dict(type=positive_int, metavar="N"), dict(type=length_range, metavar="MIN:MAX")
    return [
        group.add_argument("--input-len", **n, default=128, help="fixed: prompt tokens"),
        group.add_argument("--output-len", **n, default=64, help="fixed, shared-prefix: output tokens"),
        group.add_argument("--input-range", **lengths, default=(16, 256), help="mixed: prompt tokens (default 16:256)"),
        group.add_argument(
            "--output-range", **lengths, default=(16, 256), help="mixed: output tokens (default 16:256)"
        ),
        group.add_argument("--prefix-len", **n, default=256, help="shared-prefix: common preamble tokens"),
        group.add_argument("--suffix-len", **n, default=16, help="shared-prefix: each request's own tokens"),
        group.add_argument("--seed", type=int, default=0, help="seeds the prompts and a random model's weights"),
    ]


def command_line(actions: list[argparse.Action], args: argparse.Namespace) -> list[str]:
    """The flags that give `args` their values, for the options `actions` (argparse's, as add_argument returns
    them) whose value is not their default: one run's command line, e.g. {input_len: 8, input_range: (4, 9)} ->
    ["--input-len", "8", "--input-range", "4:9"]."""

    def text(value) -> list[str]:
        if isinstance(value, list):  # nargs="+"
            return [t for v in value for t in text(v)]
        return [":".join(map(str, value))] if isinstance(value, tuple) else [str(value)]  # MIN:MAX, KEY:MS

    argv = []
    for action in actions:
        value = getattr(args, action.dest)
        if value != action.default:
            argv += [action.option_strings[0], *([] if action.nargs == 0 else text(value))]
    return argv


def make_workload(args, pool: list[int], seed: int, num_prompts: int, repeat: int = 0) -> Workload:
    """The --workload's requests. repeat r > 0 gives round r of --repeats: the same lengths with other prompts,
    which no prefix cache has seen in an earlier round."""
    reseed = workloads.round_seed(seed, repeat)
    if args.workload == "fixed":
        return workloads.fixed(num_prompts, args.input_len, args.output_len, pool, reseed)
    if args.workload == "mixed":
        return workloads.mixed(num_prompts, args.input_range, args.output_range, pool, seed, reseed if repeat else None)
    return workloads.shared_prefix(num_prompts, args.prefix_len, args.suffix_len, args.output_len, pool, reseed)
