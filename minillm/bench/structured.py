"""python -m minillm.bench structured: what structured outputs cost and what they buy (chapter 16).

The same requests (a JSON schema each, in a chat asking for exactly that JSON when the model has a chat template,
else after a story opening) run twice at temperature 0: unguided, and guided by the schema (structured_outputs).
Reported: the share of outputs that parse and validate against their schema, each way; and the price of the
grammar, as output tokens/s of the guided batch against the same batch unconstrained with each request held to the
guided answer's length (ignore_eos), so both runs compute the same tokens in the same steps and differ only by the
grammar's work (the token bitmask of every row, the matcher following every token).

python -m minillm.bench structured --model HuggingFaceTB/SmolLM2-135M-Instruct
"""

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import jsonschema

from minillm import LLM, SamplingParams
from minillm.bench.arguments import positive_int
from minillm.bench.report import git_state, machine, versions, write_json
from minillm.config import default_model_path
from minillm.sampling_params import StructuredOutputsParams

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
    "required": ["name", "age"],
}
PET = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "kind": {"enum": ["cat", "dog", "fox", "bird"]},
        "friendly": {"type": "boolean"},
    },
    "required": ["name", "kind", "friendly"],
}
STORY = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 40},
        "characters": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
        "happy_ending": {"type": "boolean"},
    },
    "required": ["title", "characters", "happy_ending"],
}
CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "country": {"type": "string"},
        "population_millions": {"type": "number", "minimum": 0},
    },
    "required": ["city", "country"],
}
# (what to describe, its schema): the workload, cycled
TASKS = [
    ("a girl named Lily who is seven", PERSON),
    ("a friendly dog called Max", PET),
    ("a short story about a fox who finds a friend", STORY),
    ("the capital of France", CITY),
    ("an old man named Tom", PERSON),
    ("a shy cat named Daisy", PET),
    ("a story about two bunnies in the park", STORY),
    ("the biggest city of Japan", CITY),
]


def prompts(llm: LLM, num: int) -> tuple[list, list[dict]]:
    """The prompts (chat token ids when the model has a chat template, else text) and their schemas."""
    tasks = [TASKS[i % len(TASKS)] for i in range(num)]
    if llm.tokenizer.chat_template:
        ask = "Reply with only a JSON object, no other text, matching this JSON schema:\n{schema}\n\nDescribe {task}."
        chats = [[{"role": "user", "content": ask.format(schema=json.dumps(s), task=t)}] for t, s in tasks]
        return llm.encode_chat(chats), [s for _, s in tasks]
    return [f"Once upon a time, there was {t}." for t, _ in tasks], [s for _, s in tasks]


def valid(text: str, schema: dict) -> bool:
    """Does text parse as JSON and validate against schema?"""
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def timed(llm: LLM, prompts: list, params: list[SamplingParams]) -> tuple[list, float]:
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return outputs, time.perf_counter() - start


def main(argv: list[str]) -> dict:
    p = argparse.ArgumentParser(
        prog="python -m minillm.bench structured",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", metavar="DIR|ID", help="default: the embedded default model")
    p.add_argument("--num-prompts", type=positive_int, default=32)
    p.add_argument("--output-len", type=positive_int, default=160, help="max_tokens of each request (default 160)")
    p.add_argument("--repeats", type=positive_int, default=3, help="timed runs of each; the fastest counts")
    p.add_argument("--output-json", type=Path, metavar="PATH")
    args = p.parse_args(argv)
    model = args.model or str(default_model_path())
    if args.model and not Path(args.model).exists():
        from minillm.models.hub import get_model

        model = str(get_model(args.model))
    llm = LLM(model)
    inputs, schemas = prompts(llm, args.num_prompts)
    plain = SamplingParams(temperature=0, max_tokens=args.output_len)
    guide = lambda s: replace(plain, structured_outputs=StructuredOutputsParams(json=s))
    llm.generate(inputs[:2], [guide(s) for s in schemas[:2]], use_tqdm=False)  # warm up; compiles the grammars once
    unguided, _ = timed(llm, inputs, [plain] * len(inputs))
    guided, guided_s = timed(llm, inputs, [guide(s) for s in schemas])
    same_length = [replace(plain, max_tokens=len(o.token_ids), ignore_eos=True) for o in guided]
    free, free_s = timed(llm, inputs, same_length)
    for _ in range(args.repeats - 1):  # in turn, the fastest of each counts: a shared CPU's noise hits both alike
        guided_s = min(guided_s, timed(llm, inputs, [guide(s) for s in schemas])[1])
        free_s = min(free_s, timed(llm, inputs, same_length)[1])
    tokens = sum(len(o.token_ids) for o in guided)
    assert tokens == sum(len(o.token_ids) for o in free), "both runs compute the same tokens"
    share = lambda outputs: sum(valid(o.text, s) for o, s in zip(outputs, schemas)) / len(outputs)
    result = dict(
        valid_unguided=share(unguided),
        valid_guided=share(guided),
        output_tokens=tokens,
        guided_tokens_per_second=tokens / guided_s,
        unconstrained_tokens_per_second=tokens / free_s,
    )
    result["guided_throughput_ratio"] = result["guided_tokens_per_second"] / result["unconstrained_tokens_per_second"]
    cpu = machine("cpu")
    print(f"{Path(model).name}, {len(inputs)} requests, {cpu.get('cpu', '')}")
    print(
        f"valid JSON (parses and validates): unguided {result['valid_unguided']:.0%}, guided {result['valid_guided']:.0%}"
    )
    print(
        f"output tokens/s, {tokens} tokens: guided {result['guided_tokens_per_second']:.1f}, unconstrained "
        f"{result['unconstrained_tokens_per_second']:.1f}: guided runs at {result['guided_throughput_ratio']:.0%}"
    )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    record = dict(
        created=stamp,
        machine=cpu,
        versions=versions(),
        **git_state(),
        model=model,
        config={k: str(v) for k, v in vars(args).items()},
    )
    record |= dict(results=result, examples=[o.text for o in guided[:4]])
    path = args.output_json or Path("results/bench") / f"structured-{Path(model).name}-{stamp}.json"
    write_json(record, path)
    print(f"record: {path}")
    return record
