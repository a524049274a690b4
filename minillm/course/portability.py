"""What the course needs from the platform it runs on, said plainly where a chapter needs it.

- Triton (chapter 09) ships for Linux only: `triton_missing()` says why it cannot be imported here and what to
  do; `skip_without_triton("09")` is the first thing chapter 09's notebook runs, and on macOS or Windows it says
  so and turns every later cell into a note instead of an ImportError; the exercise tests are skipped with the
  same reason (minillm.course.pytest_plugin).
- torch.compile's inductor (chapters 07, 08, 11) writes C++ and compiles it with OpenMP; on macOS Apple's clang
  has no OpenMP, so `inductor_note()` says what to install.
"""

import importlib.util
import platform

LINUX_ONLY = (
    "Triton ships for Linux only, and this is {system}: chapter {chapter}'s kernels and exercises need "
    "Linux (on Windows: WSL, the Windows Subsystem for Linux, with the course set up inside it). The "
    "committed notebook shows the outputs of a Linux run; the other chapters run here."
)


def system() -> str:
    """platform.system(): "Linux", "Darwin" (macOS), "Windows" (one place, so that a test can play another one)."""
    return platform.system()


def triton_missing(chapter: str = "09") -> str | None:
    """None when `import triton` can work here; otherwise a sentence saying why not and what to do."""
    if importlib.util.find_spec("triton") is not None:
        return None
    name = system()
    if name != "Linux":
        return LINUX_ONLY.format(system={"Darwin": "macOS"}.get(name, name or "an unknown system"), chapter=chapter)
    return (
        "Triton is not installed in this environment: `make setup` installs it (pyproject.toml pins triton for Linux)."
    )


def skip_without_triton(chapter: str = "09", shell=None) -> None:
    """In a notebook that needs Triton: where it is missing, say why, and make every later cell print a one-line
    note instead of running, so that the notebook still runs top to bottom without an error. Where Triton is
    there, nothing happens. `shell` is the IPython shell (the running one by default); outside IPython only the
    reason is printed."""
    reason = triton_missing(chapter)
    if reason is None:
        return
    print(reason)
    if shell is None:
        try:
            from IPython import get_ipython
        except ImportError:
            return
        shell = get_ipython()
    if shell is not None:
        note = f"print({f'skipped: this cell needs Triton (chapter {chapter} runs on Linux or WSL)'!r})\n"
        shell.input_transformers_post.append(lambda lines: [note])


def inductor_note() -> str | None:
    """None where torch.compile's inductor can build its C++ as installed; on macOS what it needs (OpenMP)."""
    if system() != "Darwin":
        return None
    return (
        "macOS: inductor compiles its C++ with OpenMP, which Apple's clang does not ship. Install it once, "
        "with conda (`conda install -c conda-forge llvm-openmp`, in the course's environment) or Homebrew "
        "(`brew install libomp`, then `export OMP_PREFIX=$(brew --prefix libomp)` before starting "
        "JupyterLab); without it the first compile fails with \"'omp.h' file not found\"."
    )
