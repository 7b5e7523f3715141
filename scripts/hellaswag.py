"""Score a run or published GPT-2 on HellaSwag's validation set (Zellers et al. 2019), as llm.c's dev/data/hellaswag.py
scores it.

    python -m scripts.hellaswag out_dir=out/mini                        # a run, in its own tokenizer (characters too)
    python -m scripts.hellaswag init_from=gpt2 bpe_file=gpt2.tiktoken   # published GPT-2 (the hf extra), GPT-2's BPE
    python -m scripts.hellaswag out_dir=out/mini data_path=hellaswag_val.jsonl limit=500 json=true

llm.c's completion style: each example's context (`ctx`) is followed by each of its 4 endings with a leading space
(" " + ending, encoded apart from the context, as llm.c does), and each candidate is scored by the cross-entropy of
the ending's tokens given the tokens before them. acc counts the examples whose lowest summed loss is at the right
ending (`label`); acc_norm those whose lowest mean loss per token is. lm-evaluation-harness's multiple-choice style
(its own text clean-up, acc_norm per character) gives other figures: for GPT-2 124M llm.c reports acc 0.2859, acc_norm
0.2955 here and 0.2892, 0.3114 there, so compare figures of one protocol only. The 4 candidates of batch_size
examples run as one right-padded batch; the padding is masked out of the losses, and a causal model never sees it, as
it comes after every real token.

A candidate longer than the model's context window is cropped from the left, dropping context: it keeps its last
context_window + 1 tokens, so the model reads context_window of them (lm-evaluation-harness crops alike), and an ending
longer than that is scored on its tokens within them. The result says how many candidates were cropped. Without
data_path=FILE the official file is read from data/hellaswag/, downloaded there the first time.
"""
import http.client
import json
import os
import sys
import urllib.request
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import hydra
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from tqdm import tqdm

from attnlab.checkpoint import load_model
from attnlab.cli import one_line_errors, run_cli
from attnlab.config import CONFIG_DIR, HellaSwagConfig, register_configs
from attnlab.hf import from_hf
from attnlab.runtime import autocast, autocast_dtype, pick_device
from data.tokenizers import CharTokenizer, GPT2Tokenizer, load_tokenizer

register_configs()

PROTOCOL = "llm.c completion style"
URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
DEFAULT_PATH = Path("data/hellaswag/hellaswag_val.jsonl")  # relative to the working directory, as data/prepared/ is
N_ENDINGS = 4
FIELDS = ("ctx", "endings", "label")  # what the protocol reads of a line; the official file's others name its source


@dataclass
class Example:
    where: str  # "FILE line N", for messages
    ctx: str  # the context the endings continue
    endings: list[str]  # the 4 candidate endings
    label: int  # the index of the right ending


def download(path):
    """Fetch the official validation file to path, whole or not at all: written through a temporary file, renamed
    once complete. Offline, the error says where to put a copy."""
    try:
        with urllib.request.urlopen(URL, timeout=60) as response:
            contents = response.read()
    except (OSError, http.client.HTTPException) as e:  # URLError, a timeout, a connection cut mid-way
        why = getattr(e, "reason", None) or e
        raise OSError(f"could not download HellaSwag from {URL} ({why}); put hellaswag_val.jsonl at {path}, or "
                      f"pass data_path=FILE") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # one per process, so two first runs cannot mix bytes
    try:
        tmp.write_bytes(contents)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    print(f"downloaded {URL} to {path} ({len(contents):,} bytes)", file=sys.stderr)  # after: an error stays one line


def data_file(data_path):
    """The .jsonl to read: data_path, or the official file in data/hellaswag/, downloaded when missing."""
    if data_path:
        if not Path(data_path).is_file():
            raise FileNotFoundError(f"data_path={data_path} does not exist; pass the official hellaswag_val.jsonl "
                                    f"({URL})")
        return Path(data_path)
    if not DEFAULT_PATH.is_file():
        download(DEFAULT_PATH)
    return DEFAULT_PATH


def parse_example(line, where):
    """One line of the official format as an Example; a line the protocol cannot read is refused, naming it."""
    fix = "fix the line, or pass the official hellaswag_val.jsonl"
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where} is not JSON ({e.msg}); {fix}") from None
    if not isinstance(record, dict):
        raise ValueError(f"{where} is not a JSON object; {fix}")
    for name in FIELDS:
        if name not in record:
            raise ValueError(f"{where} has no {name!r} field; each example needs {', '.join(FIELDS)}, as the "
                             f"official hellaswag_val.jsonl has them")
    ctx, endings, label = record["ctx"], record["endings"], record["label"]
    if not isinstance(ctx, str) or not ctx:
        raise ValueError(f"{where}: ctx={ctx!r} must be a non-empty text, the context the endings continue; {fix}")
    if not isinstance(endings, list):
        raise ValueError(f"{where}: endings must be a list of {N_ENDINGS} texts, not a {type(endings).__name__}; {fix}")
    if len(endings) != N_ENDINGS or not all(isinstance(ending, str) for ending in endings):
        kinds = ", ".join(type(ending).__name__ for ending in endings)
        raise ValueError(f"{where}: endings must be a list of {N_ENDINGS} texts, not of {len(endings)} ({kinds}); "
                         f"{fix}")
    if type(label) is not int or not 0 <= label < N_ENDINGS:  # type(), not isinstance: true is not an index here
        raise ValueError(f"{where}: label={label!r} is out of range; it must be 0, 1, 2 or 3, the index of the right "
                         f"ending; {fix}")
    return Example(where, ctx, endings, label)


def read_examples(path, limit=None):
    """The first `limit` examples of a HellaSwag .jsonl file (None: all of them)."""
    examples = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if limit is not None and len(examples) == limit:
                break
            if line.strip():
                examples.append(parse_example(line, f"{path} line {n}"))
    if not examples:
        raise ValueError(f"{path} holds no examples; pass the official hellaswag_val.jsonl ({URL})")
    return examples


def check_covered(tokenizer, example):
    """A char vocabulary must hold every character of the example: refused otherwise, naming the ones it lacks."""
    if not isinstance(tokenizer, CharTokenizer):
        return  # a byte-level BPE encodes any text
    missing = sorted(set(" " + example.ctx + "".join(example.endings)) - tokenizer.stoi.keys())
    if missing:
        raise ValueError(f"{example.where} has characters the model's vocabulary lacks: "
                         f"{', '.join(repr(c) for c in missing)}; HellaSwag needs a tokenizer that covers its text, "
                         f"e.g. a BPE run (data.tokenizer=gpt2 or data.tokenizer=bpe)")


def candidates(example, tokenizer):
    """The example's 4 candidates as (tokens, ending's length): the context's tokens, then the ending's."""
    check_covered(tokenizer, example)
    context = tokenizer.encode(example.ctx)
    rows = []
    for ending in example.endings:
        ending_tokens = tokenizer.encode(" " + ending)  # the space that joins them starts GPT-2's next word token
        rows.append((context + ending_tokens, len(ending_tokens)))
    return rows


def crop(tokens, n_ending, context_window):
    """tokens cut to what the model reads, from the left: the last context_window + 1 (the first only as context;
    None: no limit), and how many ending tokens remain to score."""
    if context_window is not None and len(tokens) > context_window + 1:
        tokens = tokens[-(context_window + 1):]
    return tokens, min(n_ending, len(tokens) - 1)


@torch.no_grad()
def candidate_losses(model, rows, device, amp=nullcontext()):
    """The summed and the mean loss (nats) of each row's scored tokens given the tokens before them, all rows as one
    right-padded batch. rows: (tokens, n_scored), the last n_scored tokens scored. Returns sums (N,), means (N,)."""
    width = max(len(tokens) for tokens, _ in rows) - 1
    x = torch.zeros(len(rows), width, dtype=torch.long)  # (N, T) inputs; padding id 0, never read
    y = torch.zeros(len(rows), width, dtype=torch.long)  # (N, T) each input's next token
    scored = torch.zeros(len(rows), width, dtype=torch.bool)  # (N, T) the targets that are the ending's tokens
    for i, (tokens, n_scored) in enumerate(rows):
        T = len(tokens) - 1
        x[i, :T] = torch.tensor(tokens[:-1])
        y[i, :T] = torch.tensor(tokens[1:])
        scored[i, T - n_scored:T] = True
    x, y, scored = x.to(device), y.to(device), scored.to(device)
    with amp:
        logits, _ = model(x)  # (N, T, vocab)
    logits = logits[scored]  # (scored tokens, vocab), row by row
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # an autocast forward's bf16: losses in fp32
    nats = F.cross_entropy(logits, y[scored], reduction="none")  # (scored tokens,)
    row_of_each = scored.nonzero()[:, 0]
    sums = nats.new_zeros(len(rows)).index_add_(0, row_of_each, nats)
    means = sums / scored.sum(1)
    return sums.cpu(), means.cpu()


def score_examples(model, tokenizer, examples, batch_size, device, amp=nullcontext()):
    """Every candidate's summed and mean ending loss, (examples, 4) each, batch_size examples at a time, and how
    many candidates were cropped to the model's context window."""
    window = model.context_window
    rows = [row for example in examples for row in candidates(example, tokenizer)]
    cropped = len([tokens for tokens, _ in rows if window is not None and len(tokens) > window + 1])
    rows = [crop(tokens, n_ending, window) for tokens, n_ending in rows]
    sums, means = [], []
    with tqdm(total=len(examples), desc="hellaswag", unit="example", dynamic_ncols=True, mininterval=1.0) as bar:
        for start in range(0, len(rows), N_ENDINGS * batch_size):
            batch = rows[start:start + N_ENDINGS * batch_size]
            batch_sums, batch_means = candidate_losses(model, batch, device, amp)
            sums.append(batch_sums)
            means.append(batch_means)
            bar.update(len(batch) // N_ENDINGS)
    return torch.cat(sums).view(-1, N_ENDINGS), torch.cat(means).view(-1, N_ENDINGS), cropped


def hellaswag(cfg: HellaSwagConfig, out=sys.stdout) -> dict:
    """Score the model cfg names on HellaSwag; prints the result to `out` and returns it."""
    device = pick_device(cfg.device)
    amp = autocast(device, autocast_dtype(device, cfg.dtype))
    if cfg.init_from:
        model, tokenizer = from_hf(cfg.init_from).to(device), GPT2Tokenizer(cfg.bpe_file, option="bpe_file")
        name = f"init_from={cfg.init_from}"
    else:
        model, meta = load_model(cfg.out_dir, cfg.checkpoint, device)
        tokenizer = load_tokenizer(meta)
        name = f"{cfg.out_dir} (checkpoint={cfg.checkpoint})"
    path = data_file(cfg.data_path)
    examples = read_examples(path, cfg.limit)
    sums, means, cropped = score_examples(model, tokenizer, examples, cfg.batch_size, device, amp)
    labels = torch.tensor([example.label for example in examples])
    n = len(examples)
    result = {"model": cfg.init_from or cfg.out_dir, "checkpoint": None if cfg.init_from else cfg.checkpoint,
              "data_path": str(path), "protocol": PROTOCOL, "acc": (sums.argmin(1) == labels).sum().item() / n,
              "acc_norm": (means.argmin(1) == labels).sum().item() / n, "examples": n,
              "candidates_cropped": cropped, "context_window": model.context_window}
    if cfg.json:
        out.write(json.dumps(result) + "\n")
        return result
    out.write(f"{name} on HellaSwag's validation set ({path}), {PROTOCOL}:\n"
              f"  acc       {result['acc']:.4f}  ({PROTOCOL}: lowest summed loss of the ending; {n:,} examples)\n"
              f"  acc_norm  {result['acc_norm']:.4f}  ({PROTOCOL}: lowest mean loss per ending token; {n:,} "
              f"examples)\n")
    if cropped:
        out.write(f"  {cropped:,} of {N_ENDINGS * n:,} candidates were longer than the model's context window of "
                  f"{model.context_window} tokens: their context was cropped from the left\n")
    return result


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="hellaswag")
@one_line_errors
def main(dict_cfg):
    hellaswag(OmegaConf.to_object(dict_cfg))


if __name__ == "__main__":
    run_cli(main, help_script="-m scripts.hellaswag")
