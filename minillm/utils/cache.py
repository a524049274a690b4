"""minillm's cache directory: converted checkpoints (models/), kernel choices (kernel-choices.json)."""

import os
from pathlib import Path


def cache_dir() -> Path:
    """$MINILLM_CACHE, else $XDG_CACHE_HOME/minillm, else ~/.cache/minillm."""
    if os.environ.get("MINILLM_CACHE"):
        return Path(os.environ["MINILLM_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "minillm"
