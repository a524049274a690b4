"""The course's command line.

    python -m minillm.course build [--check] [--force]   write exercises/ and solutions/ from minillm's markers
    python -m minillm.course grade NN|all                 grade your exercises/exNN_<topic>.py
    python -m minillm.course notebooks [--inplace] [NN …] run the notebooks headless (and save their outputs)
    python -m minillm.course check                        chapter 00: is this machine ready for the course?
"""
import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minillm.course", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="write exercises/exNN_*.py and solutions/exNN_*.py")
    build.add_argument("--check", action="store_true", help="write nothing; fail if a file is out of date")
    build.add_argument("--force", action="store_true", help="also overwrite exercise files you have edited")
    grade = commands.add_parser("grade", help="run a chapter's exercise tests on your code")
    grade.add_argument("chapter", help="a chapter number (03) or all")
    grade.add_argument("--impl", choices=("exercises", "solutions"), default="exercises")
    notebooks = commands.add_parser("notebooks", help="execute the notebooks headless")
    notebooks.add_argument("chapters", nargs="*", help="chapter numbers (default: every notebook)")
    notebooks.add_argument("--inplace", action="store_true", help="save the outputs into the notebooks")
    commands.add_parser("check", help="check Python, packages, device and the default model")
    args = parser.parse_args(argv)

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

        return grade(args.chapter, args.impl)
    if args.command == "notebooks":
        from minillm.course.notebooks import run

        return run(args.chapters, args.inplace)
    from minillm.course.env_check import check_environment

    return 0 if check_environment() else 1


if __name__ == "__main__":
    sys.exit(main())
