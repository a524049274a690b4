"""The course's command line.

    python -m minillm.course build [--check] [--force]   write exercises/ and solutions/ from minillm's markers
    python -m minillm.course grade NN.k|NN|all            grade your exercise NN.k, chapter NN, or everything
    python -m minillm.course hint NN.k [--level 2]        hints for exercise NN.k, levels 1 (approach) to 3
    python -m minillm.course notebooks [--inplace] [NN …] run the notebooks headless (and save their outputs)
    python -m minillm.course check                        chapter 00: is this machine ready for the course?

build, grade and notebooks work on the course folder you run them in (or below); --root DIR names another.
"""

import argparse
import os
import sys

from minillm.course.root import ENV, CourseNotFound


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m minillm.course", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument(
        "--root", metavar="DIR", help=f"the course folder (default: found from the working directory, or ${ENV})"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", parents=[where], help="write exercises/exNN_*.py and solutions/exNN_*.py")
    build.add_argument("--check", action="store_true", help="write nothing; fail if a file is out of date")
    build.add_argument("--force", action="store_true", help="also overwrite exercise files you have edited")
    grade = commands.add_parser("grade", parents=[where], help="run exercise tests on your code")
    grade.add_argument("which", metavar="NN.k|NN|all", help="an exercise (05.4), a chapter (05) or all")
    grade.add_argument("--impl", choices=("exercises", "solutions"), default="exercises")
    hint = commands.add_parser("hint", help="a hint for an exercise, more precise at each level")
    hint.add_argument("exercise", metavar="NN.k", help="the exercise, e.g. 05.4")
    hint.add_argument(
        "--level",
        type=int,
        default=1,
        help="show hints 1 to LEVEL (1 approach, 2 key operation, 3 shapes and pitfalls; default 1)",
    )
    notebooks = commands.add_parser("notebooks", parents=[where], help="execute the notebooks headless")
    notebooks.add_argument("chapters", nargs="*", help="chapter numbers (default: every notebook)")
    notebooks.add_argument("--inplace", action="store_true", help="save the outputs into the notebooks")
    commands.add_parser("check", help="check Python, packages, device and the default model")
    args = parser.parse_args(argv)

    if getattr(args, "root", None):
        os.environ[ENV] = args.root  # read by course_root(), and inherited by notebook kernels
    try:
        return _run(args)
    except CourseNotFound as e:
        print(e, file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    if args.command == "build":
        from minillm.course.build import build, check

        if args.check:
            problems = check()
            for line in problems:
                print(line)
            if problems:
                print("Run `python -m minillm.course build` to regenerate them from minillm's exercise markers.")
            return 1 if problems else 0
        done, refused = build(force=args.force)
        print("\n".join(done + refused) or "exercises/ and solutions/ are up to date.")
        return 1 if refused else 0
    if args.command == "grade":
        from minillm.course.grade import grade

        return grade(args.which, args.impl)
    if args.command == "hint":
        from minillm.course.hints import hint

        try:
            print(hint(args.exercise, args.level))
        except ValueError as e:
            print(e, file=sys.stderr)
            return 2
        return 0
    if args.command == "notebooks":
        from minillm.course.notebooks import run

        return run(args.chapters, args.inplace)
    from minillm.course.env_check import check_environment

    return 0 if check_environment() else 1


if __name__ == "__main__":
    sys.exit(main())
