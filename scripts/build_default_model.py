#!/usr/bin/env python
"""Build minillm's embedded default model: a small Qwen3 that tells children's stories.

    python scripts/build_default_model.py                 # about an hour on 2 CPU cores
    python scripts/build_default_model.py --steps 30 --out /tmp/m   # a quick look
    python scripts/build_default_model.py --draft         # the draft model for speculative decoding

Steps: generate the story corpus (minillm.data), train a byte-level BPE tokenizer on it, train a
Qwen3ForCausalLM from scratch on "<bos> story <eos>" documents with AdamW and a cosine schedule,
measure it (held-out loss; sentence validity of sampled stories), and write a Hugging Face directory:
config.json, generation_config.json, model.safetensors (fp32), tokenizer files and a model card.
Everything is seeded: the same command gives the same loss curve and the same figures.

--draft builds a much smaller model on the same corpus (the DRAFT preset, written to assets/draft_model) that
reuses the default model's tokenizer files as they are, so that its token ids are the default model's: a draft
for speculative decoding must propose tokens in the target's vocabulary. Its card adds the greedy acceptance
rate: how often the draft's next token is the default model's, along the default model's greedy stories.
"""

import argparse
import json
import math
import os
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

# Worker threads that wait for work sleep instead of spinning: on a shared CPU, spinning threads steal
# the cores their partners need, and a training step gets several times slower. Set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402
from tqdm import tqdm  # noqa: E402
from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from minillm.data import HELDOUT_SEED, TRAIN_SEED, generate_corpus  # noqa: E402
from minillm.data.tokenizer_training import BOS, EOS, PAD, save_tokenizer, train_tokenizer  # noqa: E402
from minillm.utils.autotune import cpu_model  # noqa: E402

ASSETS = Path(__file__).resolve().parents[1] / "minillm" / "assets"
DEFAULT_OUT, DRAFT_OUT = ASSETS / "default_model", ASSETS / "draft_model"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


@dataclass
class BuildConfig:
    seed: int = 0
    n_stories: int = 30_000  # training stories (corpus seed TRAIN_SEED)
    n_heldout: int = 500  # held-out stories for the held-out loss (seed HELDOUT_SEED)
    vocab_size: int = 4096  # an upper bound: BPE runs out of merges sooner on this corpus
    hidden_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 8
    num_key_value_heads: int = 2  # even, so that tensor parallelism of 2 splits the KV heads
    head_dim: int = 32
    intermediate_size: int = 768
    max_position_embeddings: int = 512
    batch_size: int = 32  # stories per step
    steps: int = 2000
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup: int = 60
    weight_decay: float = 0.1
    threads: int = 2


# The draft for speculative decoding: same corpus and tokenizer, a ninth of the parameters and one layer instead of
# four, so that a forward costs several times less. One wide layer beat two narrow ones (hidden 96) of the same size
# on held-out loss and greedy acceptance in 300- and 700-step trials, and it is the cheaper forward.
DRAFT = BuildConfig(
    vocab_size=1280,  # not used: the default model's tokenizer is loaded (this is its size)
    hidden_size=128,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    intermediate_size=384,
    steps=1500,
    lr=5e-3,
)


def model_config(cfg: BuildConfig, vocab_size: int, bos: int, eos: int, pad: int) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
        dtype="float32",
        architectures=["Qwen3ForCausalLM"],
    )


def batches(docs: list[list[int]], batch_size: int, pad: int, rng: random.Random):
    """Endless padded batches [B, T]. Each epoch shuffles, then sorts stories by length within windows of
    50 batches so that a batch holds stories of similar length (little padding), then shuffles batches."""
    while True:
        order = list(range(len(docs)))
        rng.shuffle(order)
        window = 50 * batch_size
        epoch = []
        for w in range(0, len(order), window):
            chunk = sorted(order[w : w + window], key=lambda i: len(docs[i]))
            epoch += [chunk[b : b + batch_size] for b in range(0, len(chunk), batch_size)]
        rng.shuffle(epoch)
        for idx in epoch:
            width = max(len(docs[i]) for i in idx)
            yield torch.tensor([docs[i] + [pad] * (width - len(docs[i])) for i in idx])


def lm_loss(model, ids: torch.Tensor, pad: int) -> torch.Tensor:
    """Mean next-token cross-entropy over real tokens. Padding is on the right and attention is causal,
    so real tokens never see padding and no attention mask is needed; padded targets are ignored."""
    logits = model(input_ids=ids).logits[:, :-1]
    targets = ids[:, 1:].masked_fill(ids[:, 1:] == pad, -100)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)


@torch.no_grad()
def eval_loss(model, docs: list[list[int]], pad: int, batch_size: int = 50) -> float:
    """Token-weighted mean loss over `docs`."""
    model.eval()
    total, count = 0.0, 0
    for b in range(0, len(docs), batch_size):
        chunk = docs[b : b + batch_size]
        width = max(map(len, chunk))
        ids = torch.tensor([d + [pad] * (width - len(d)) for d in chunk])
        n = sum(len(d) - 1 for d in chunk)
        total += lm_loss(model, ids, pad).item() * n
        count += n
    model.train()
    return total / count


def lr_at(step: int, cfg: BuildConfig) -> float:
    """Linear warm-up, then cosine decay to min_lr_ratio * lr."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def train(cfg: BuildConfig, progress: bool = True, tokenizer_dir: Path | None = None) -> dict:
    """Corpus -> tokenizer -> trained model. Returns the model, the tokenizer and the training record.
    With `tokenizer_dir`, the tokenizer is loaded from there instead of trained (cfg.vocab_size is then unused)."""
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    stories, heldout = generate_corpus(cfg.n_stories, TRAIN_SEED), generate_corpus(cfg.n_heldout, HELDOUT_SEED)
    if tokenizer_dir is None:
        tok = train_tokenizer(stories, cfg.vocab_size)
    else:
        tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    pad, bos, eos = (tok.token_to_id(t) for t in (PAD, BOS, EOS))
    # "<bos> story <eos>": the tokenizer puts <bos> in front, we append <eos>.
    encode = lambda texts: [e.ids + [eos] for e in tok.encode_batch(texts)]  # noqa: E731
    docs, heldout_docs = encode(stories), encode(heldout)
    assert max(map(len, docs + heldout_docs)) <= cfg.max_position_embeddings

    model = Qwen3ForCausalLM(model_config(cfg, tok.get_vocab_size(), bos, eos, pad))
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.95),
    )
    data = batches(docs, cfg.batch_size, pad, random.Random(cfg.seed))
    losses, tokens, start = [], 0, time.perf_counter()
    bar = tqdm(range(cfg.steps), desc="training", disable=not progress, mininterval=2.0)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        ids = next(data)
        loss = lm_loss(model, ids, pad)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        tokens += int((ids != pad).sum())
        bar.set_postfix(loss=f"{sum(losses[-20:]) / len(losses[-20:]):.4f}", lr=f"{lr_at(step, cfg):.1e}")
    seconds = time.perf_counter() - start
    record = {
        "losses": losses,
        "train_seconds": seconds,
        "train_tokens": tokens,
        "corpus_tokens": sum(map(len, docs)),
        "vocab_size": tok.get_vocab_size(),
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_loss": eval_loss(model, docs[: cfg.n_heldout], pad),
        "heldout_loss": eval_loss(model, heldout_docs, pad),
    }
    return {"model": model.eval(), "tokenizer": tok, "tokenizer_dir": tokenizer_dir, "record": record}


@torch.no_grad()
def greedy_acceptance(draft, target, tokenizer, n: int = 50, max_new_tokens: int = 320) -> dict:
    """How often the draft's argmax is the target's, at each position of the target's greedy continuations of
    `n` held-out openings: alpha, the per-token acceptance rate of greedy speculative decoding. With k draft
    tokens per verify step, and acceptances taken as independent, a step yields (1 - alpha^(k+1)) / (1 - alpha)
    tokens on average (k accepted plus the target's own)."""
    from minillm.data.stories import heldout_openings

    tokenizer.padding_side = "left"
    batch = tokenizer(heldout_openings(n), return_tensors="pt", padding=True)
    width, pad = batch["input_ids"].shape[1], tokenizer.pad_token_id
    out = target.generate(**batch, do_sample=False, max_length=width + max_new_tokens, pad_token_id=pad)
    same = count = 0
    for row, mask in zip(out, batch["attention_mask"]):
        prompt, completion = row[:width][mask.bool()], row[width:][row[width:] != pad]
        ids = torch.cat([prompt, completion])[None]  # logits at len(prompt)-1 .. end-1 predict the completion
        want = target(input_ids=ids).logits[0, len(prompt) - 1 : -1].argmax(-1)
        same += int((draft(input_ids=ids).logits[0, len(prompt) - 1 : -1].argmax(-1) == want).sum())
        count += len(want)
    alpha = same / count
    expected = {f"tokens_per_step_k{k}": (1 - alpha ** (k + 1)) / (1 - alpha) for k in (2, 3, 4, 5)}
    return {"alpha": alpha, "alpha_positions": count, **expected}


def model_card(cfg: BuildConfig, rec: dict, quality: dict, command: str) -> str:
    q = quality
    example = next(p + t for p, t, kept in zip(q["prompts"], q["nucleus"], q["kept"]) if kept)
    return f"""# minillm default model: a tiny story-telling Qwen3

A {rec['parameters'] / 1e6:.2f}M-parameter Qwen3-architecture model trained from scratch on synthetic children's
stories generated by `minillm.data`. It ships inside the package (`minillm.default_model_path()`) so that
every chapter of the course has a model whose output a person can read and a test can judge, with no download.

## Architecture
Qwen3ForCausalLM, fp32: hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers, {cfg.num_attention_heads} query heads,
{cfg.num_key_value_heads} KV heads, head_dim {cfg.head_dim}, intermediate {cfg.intermediate_size}, tied embeddings,
max_position_embeddings {cfg.max_position_embeddings}, vocab {rec['vocab_size']}.

## Tokenizer
Byte-level BPE trained on the corpus (`tokenizers`), {rec['vocab_size']} tokens. Specials: `<pad>` = 0, `<bos>` = 1,
`<eos>` = 2. Encoding puts `<bos>` in front of the text; each training document was `<bos> story <eos>`,
so generation stops by itself at `<eos>`.

## Training
Command: `{command}` (seed {cfg.seed}, {cfg.threads} CPU threads).
Data: {cfg.n_stories} stories (corpus seed {TRAIN_SEED}, {rec['corpus_tokens']:,} tokens); held-out: {cfg.n_heldout}
stories (seed {HELDOUT_SEED}). {cfg.steps} steps of {cfg.batch_size} stories ({rec['train_tokens']:,} tokens seen), AdamW
(lr {cfg.lr}, betas 0.9/0.95, weight decay {cfg.weight_decay}), {cfg.warmup} warm-up steps then cosine decay to
{cfg.min_lr_ratio:g} x lr, gradient clipping 1.0. Training time: {rec['train_seconds'] / 60:.1f} minutes.

## Results
- final train loss {rec['train_loss']:.4f}, held-out loss {rec['heldout_loss']:.4f} (nats per token)
- sentence validity, {len(q['sampled'])} stories sampled at temperature 0.8 (no top-k/top-p) from held-out
  openings: {q['valid']} of {q['total']} sentences pass the grammar checker = **{100 * q['validity']:.1f}%**
- greedy continuations of {len(q['greedy'])} openings: {q['greedy_valid']} of {q['greedy_total']} sentences valid
  ({100 * q['greedy_validity']:.1f}%)
- cast: {100 * q['cast_kept']:.1f}% of {len(q['kept'])} stories sampled at temperature 0.8 and top-p {q['cast_top_p']} from
  held-out openings keep one hero and at most one friend by name from start to end (`keeps_its_cast` in
  `minillm.data.checker`; {100 * q['cast_kept_unfiltered']:.1f}% of the stories sampled without top-p above)

Rerun the measurement: `python scripts/evaluate_default_model.py`. The whole build (corpus, tokenizer, training,
these measurements) took {rec['build_seconds'] / 60:.0f} minutes on {rec['cpu']} with {cfg.threads} threads.

## Example (temperature 0.8, top-p {q['cast_top_p']}; the prompt is the first two sentences)
> {example.strip()}
"""


def draft_card(cfg: BuildConfig, rec: dict, quality: dict, command: str) -> str:
    q = quality
    gains = ", ".join(f"k={k}: {q[f'tokens_per_step_k{k}']:.2f}" for k in (2, 3, 4, 5))
    return f"""# minillm draft model: a tiny Qwen3 for speculative decoding of the default model

A {rec['parameters'] / 1e6:.2f}M-parameter Qwen3-architecture model trained from scratch on the default model's
corpus, with the default model's tokenizer (`tokenizer.json` and `tokenizer_config.json` are copies of
`assets/default_model`'s, so the token ids are the same). It proposes tokens; the default model verifies them.

## Architecture
Qwen3ForCausalLM, fp32: hidden {cfg.hidden_size}, layers {cfg.num_hidden_layers}, {cfg.num_attention_heads} query heads,
{cfg.num_key_value_heads} KV heads, head_dim {cfg.head_dim}, intermediate {cfg.intermediate_size}, tied embeddings,
max_position_embeddings {cfg.max_position_embeddings}, vocab {rec['vocab_size']} (`<pad>` = 0, `<bos>` = 1, `<eos>` = 2).

## Training
Command: `{command}` (seed {cfg.seed}, {cfg.threads} CPU threads).
Data: {cfg.n_stories} stories (corpus seed {TRAIN_SEED}); held-out: {cfg.n_heldout} stories (seed {HELDOUT_SEED}).
{cfg.steps} steps of {cfg.batch_size} stories ({rec['train_tokens']:,} tokens seen), AdamW (lr {cfg.lr}, betas 0.9/0.95,
weight decay {cfg.weight_decay}), {cfg.warmup} warm-up steps then cosine decay to {cfg.min_lr_ratio:g} x lr, gradient
clipping 1.0. Training time: {rec['train_seconds'] / 60:.1f} minutes.

## Results
- held-out loss {rec['heldout_loss']:.4f} nats per token (default model: {q['target_heldout_loss']:.4f})
- greedy acceptance: along the default model's greedy continuations of {q['alpha_stories']} held-out openings, the
  draft's argmax is the default model's at {100 * q['alpha']:.1f}% of {q['alpha_positions']:,} positions (alpha)
- expected tokens per verify step with k draft tokens, acceptances taken as independent,
  (1 - alpha^(k+1)) / (1 - alpha): {gains}
- on its own, sampled at temperature 0.8: {q['valid']} of {q['total']} sentences valid ({100 * q['validity']:.1f}%)
"""


def save(out: Path, built: dict, cfg: BuildConfig, quality: dict, command: str, draft: bool = False) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model, rec = built["model"], built["record"]
    model.save_pretrained(out, safe_serialization=True)
    c = model.config
    GenerationConfig(
        bos_token_id=c.bos_token_id,
        eos_token_id=c.eos_token_id,
        pad_token_id=c.pad_token_id,
        max_length=cfg.max_position_embeddings,
    ).save_pretrained(out)
    if built["tokenizer_dir"] is None:
        save_tokenizer(built["tokenizer"], out, cfg.max_position_embeddings)
    else:  # the very files, so that the ids cannot differ
        for name in TOKENIZER_FILES:
            shutil.copyfile(built["tokenizer_dir"] / name, out / name)
    (out / "README.md").write_text((draft_card if draft else model_card)(cfg, rec, quality, command))
    figures = {k: v for k, v in quality.items() if not isinstance(v, list)}
    summary = {"config": asdict(cfg), **{k: v for k, v in rec.items() if k != "losses"}, **figures}
    (out / "training_log.json").write_text(json.dumps({**summary, "losses": [round(x, 5) for x in rec["losses"]]}))


def main() -> None:
    first = argparse.ArgumentParser(add_help=False)  # --draft first: it sets the defaults of the other options
    first.add_argument("--draft", action="store_true", help="the DRAFT preset, with the default model's tokenizer")
    draft = first.parse_known_args()[0].draft
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1], parents=[first])
    preset = DRAFT if draft else BuildConfig()  # the defaults of the options below
    p.add_argument("--out", type=Path, default=DRAFT_OUT if draft else DEFAULT_OUT)
    for name, value in asdict(preset).items():
        p.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    args = p.parse_args()
    cfg = BuildConfig(**{k: getattr(args, k) for k in asdict(preset)})
    start = time.perf_counter()
    built = train(cfg, tokenizer_dir=DEFAULT_OUT if draft else None)
    rec = built["record"]
    print(
        f"{rec['parameters']:,} parameters, {rec['train_seconds'] / 60:.1f} min, "
        f"train loss {rec['train_loss']:.4f}, held-out loss {rec['heldout_loss']:.4f}"
    )
    from transformers import PreTrainedTokenizerFast

    from minillm.data.quality import evaluate_model

    hf_tok = PreTrainedTokenizerFast(tokenizer_object=built["tokenizer"], bos_token=BOS, eos_token=EOS, pad_token=PAD)
    quality = evaluate_model(built["model"], hf_tok)
    print(
        f"sentence validity {quality['valid']}/{quality['total']} = {100 * quality['validity']:.1f}%, "
        f"greedy {quality['greedy_valid']}/{quality['greedy_total']}"
    )
    if draft:
        target = Qwen3ForCausalLM.from_pretrained(DEFAULT_OUT).eval()
        target_loss = json.loads((DEFAULT_OUT / "training_log.json").read_text())["heldout_loss"]
        quality |= {"target_heldout_loss": target_loss, "alpha_stories": 50}
        quality |= greedy_acceptance(built["model"], target, hf_tok, quality["alpha_stories"])
        print(f"greedy acceptance alpha {quality['alpha']:.4f} over {quality['alpha_positions']} positions")
    rec |= {"build_seconds": time.perf_counter() - start, "cpu": cpu_model()}
    command = "python scripts/build_default_model.py" + " --draft" * draft
    command += "".join(f" --{k.replace('_', '-')} {v}" for k, v in asdict(cfg).items() if v != getattr(preset, k))
    save(args.out, built, cfg, quality, command, draft)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
