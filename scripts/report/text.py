"""What a trained GPT's heads attend to in real code, the code counterpart of "a pronoun attends to its referent":
windows of the stdlib corpus's val split, each case found automatically (a closing bracket and its opener; a name's
first use after its definition), each head's weight on the target against its weight at the same distance elsewhere.
The first half of the windows picks each kind's best head, the second half reports it. docs/report.md says how cases
are found. `python -m scripts.report --only text` (after the lm experiment, which it runs first where needed)
"""
import json
import keyword
import re
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch
from tqdm import tqdm

from attnlab.checkpoint import load_model
from attnlab.config import DataConfig
from attnlab.record import read_metrics
from data.corpus import load_split, prepare
from data.tokenizers import load_tokenizer
from scripts.report.lm import best_run

BUDGET = dict(quick=1000, full=3000)  # windows read, at most: the stdlib val split holds about 2700
OPENERS, CLOSERS = "([{", ")]}"
DEFINITIONS = [re.compile(pattern, re.M) for pattern in (  # each captures the defined name (docs/report.md)
    r"^[ \t]*(?:def|class)[ \t]+(\w+)", r"^[ \t]*(\w+)(?:[ \t]*:[\w.\[\], |'\"]*)?[ \t]+=[ \t]",
    r"\b(?:for|as|import)[ \t]+(\w+)")]
SIGNATURE, PARAMETER = re.compile(r"^[ \t]*def[ \t]+\w+\(([^)]*)", re.M), re.compile(r"(?:^|,)\s*\**(\w+)")
WELL_ABOVE = 2.0  # a head is "well above baseline" when its mean weight on the target is this many times its baseline
SHOWN_DISTANCE = 40  # the example map's case is picked among those at most this far apart, so its labels stay legible
KINDS = {"bracket": "the opener", "name": "the definition"}


def in_code(text):
    """Per character of text, whether it lies outside comments and string literals (roughly; see bracket_cases)."""
    code, i = [True] * len(text), 0
    while i < len(text):
        c = text[i]
        if c == "#":
            end = text.find("\n", i) % (len(text) + 1)  # the comment ends with its line, or with the text
        elif c in "'\"":
            end = string_end(text, i, c * 3 if text.startswith(c * 3, i) else c)
        else:
            i += 1
            continue
        code[i:end] = [False] * (end - i)
        i = end
    return code


def string_end(text, start, quote):
    """Where the string literal opened by quote at start ends: after its closing quote, at the end of its line (one
    quote: an unterminated string), or at the end of the text."""
    i = start + len(quote)
    while i < len(text):
        if text[i] == "\\":
            i += 2  # an escaped character cannot close the string
        elif text.startswith(quote, i):
            return i + len(quote)
        elif text[i] == "\n" and len(quote) == 1:
            return i
        else:
            i += 1
    return len(text)


def bracket_cases(text):
    """(query, target) pairs: each closing bracket of text and its matching opener, in code only."""
    pairs, stack = [], []
    for i, (c, code) in enumerate(zip(text, in_code(text))):
        if code and c in OPENERS:
            stack.append(i)
        elif code and c in CLOSERS:
            if stack and text[stack[-1]] == OPENERS[CLOSERS.index(c)]:
                opener = stack.pop()
                if i - opener >= 2:
                    pairs.append((i, opener))
            else:
                stack.clear()  # its opener is before the text, or the rough string scan lost track: start afresh
    return pairs


def definitions(text):
    """(name, end) for each name that text's code defines, by position (docs/report.md)."""
    found = [(m[1], m.start(1), m.end(1)) for pattern in DEFINITIONS for m in pattern.finditer(text)]
    for signature in SIGNATURE.finditer(text):
        offset = signature.start(1)
        found += [(m[1], offset + m.start(1), offset + m.end(1)) for m in PARAMETER.finditer(signature[1])]
    code = in_code(text)
    return [(name, end) for name, start, end in sorted(found, key=lambda f: f[1]) if code[start]]


def name_cases(text):
    """(query, target) pairs: the second-to-last character of a defined name's first use, and the last character of
    its definition."""
    pairs, seen = [], set()
    for name, end in definitions(text):
        if len(name) < 3 or keyword.iskeyword(name) or name in seen:
            continue
        seen.add(name)
        uses = [m.end() for m in re.finditer(rf"(?<!\w){re.escape(name)}(?!\w)", text)]
        if uses[0] == end and len(uses) > 1:  # the definition is the name's first occurrence in text
            pairs.append((uses[1] - 2, end - 1))
    return pairs


def line_windows(ids, newline, T, count):
    """Up to count non-overlapping windows of T tokens (W, T), spread evenly over ids, each starting at a line start
    (fewer windows start inside a string)."""
    line_starts = np.flatnonzero(np.asarray(ids[:len(ids) - T]) == newline) + 1
    starts, end = [], 0
    for s in line_starts[np.linspace(0, len(line_starts) - 1, count).astype(int)]:
        if s >= end:
            starts.append(s)
            end = s + T
    return torch.stack([torch.from_numpy(ids[s:s + T].astype(np.int64)) for s in starts])


def find_cases(windows, decode):
    """Per kind, (window, query, target) triples in window order; a target at distance T - 1 is dropped, as no
    other query sits that far from a key to give it a baseline."""
    cases = {kind: [] for kind in KINDS}
    for w, ids in enumerate(windows.tolist()):
        text = decode(ids)
        for kind, finder in (("bracket", bracket_cases), ("name", name_cases)):
            cases[kind] += [(w, q, t) for q, t in finder(text) if q - t < len(ids) - 1]
    return cases


@torch.no_grad()
def head_weights(model, windows, cases, device="cpu", batch_size=32):
    """For each kind's cases (window, query, target) in window order, each (N, L, H) over layers and heads: target
    (the weight on the target), distance (the mean weight at the target's distance from the window's other queries),
    same_token (the mean weight on other visible keys holding the target's token; nan where none), previous (on the
    token before the query) and argmax (the target is the query's largest weight); uniform (N,) is 1/(visible
    keys). One pass over the windows (W, T), each batch moved to device, serves every kind."""
    out = {kind: {k: [] for k in ("target", "distance", "same_token", "previous", "argmax")} for kind in cases}
    done = dict.fromkeys(cases, 0)  # each kind's cases measured so far
    for first in tqdm(range(0, len(windows), batch_size), desc="text attention", leave=False):
        batch = windows[first:first + batch_size].to(device)
        maps = torch.stack(model.attention_maps(batch), 1).float().cpu()  # (B, L, H, T, T)
        for kind, found in cases.items():
            for w, q, t in found[done[kind]:]:
                if w >= first + batch_size:
                    break
                done[kind] += 1
                a, ids, values = maps[w - first], windows[w], out[kind]  # (L, H, T, T), (T,)
                row = a[:, :, q]  # (L, H, T): the query's weight on every key
                diagonal = a.diagonal(t - q, -2, -1)  # (L, H, T - (q - t)): each query's weight at that distance
                same = ids[:q + 1] == ids[t]
                same[t] = False
                values["target"].append(row[..., t])
                values["distance"].append((diagonal.sum(-1) - row[..., t]) / (diagonal.size(-1) - 1))
                values["same_token"].append(row[..., :q + 1][..., same].mean(-1))  # nan where no other key holds it
                values["previous"].append(row[..., q - 1])
                values["argmax"].append(row.argmax(-1) == t)
    return {kind: {**{k: torch.stack(v) for k, v in out[kind].items()},
                   "uniform": torch.tensor([1 / (q + 1) for _, q, _ in cases[kind]])} for kind in cases}


def subset(values, keep):
    return {k: v[keep] for k, v in values.items()}


def best_head(values):
    """(layer, head) whose mean weight on the target most exceeds its same-distance baseline."""
    gain = (values["target"] - values["distance"]).mean(0)  # (L, H)
    return divmod(int(gain.argmax()), gain.size(1))


def exp_text(ctx, run=None):
    """Closing brackets and their openers, uses of a name and its definition: which heads attend there?"""
    run = run or ctx.text_run
    run = Path(run or best_run(ctx, "gpt"))  # the lm experiment's GPT, trained first where it is not there
    model, meta = load_model(run, device=ctx.device)
    if meta["name"] != "stdlib" or meta["tokenizer"]["type"] != "char":
        print(f"text: skipped, as {run} was trained on {meta['name']} ({meta['tokenizer']['type']} tokens); it reads "
              f"Python code a character at a token: run the lm experiment on the stdlib corpus (no --data-path)")
        return
    data_cfg = DataConfig(**json.loads((run / "config.json").read_text())["config"]["data"])
    T, tokenizer = model.config.block_size, load_tokenizer(meta)
    windows = line_windows(load_split(prepare(data_cfg, T), "val"), tokenizer.stoi["\n"], T,
                           BUDGET[ctx.preset])
    cases, half = find_cases(windows, tokenizer.decode), len(windows) // 2
    for kind, found in cases.items():
        if not 0 < sum(w < half for w, _, _ in found) < len(found):
            raise ValueError(f"text: no {kind} case in one half of the {len(windows)} windows; raise BUDGET's windows")
    results = {}
    for kind, values in head_weights(model, windows, cases, ctx.device).items():
        test = torch.tensor([w >= half for w, _, _ in cases[kind]])
        results[kind] = dict(head=best_head(subset(values, ~test)), test=subset(values, test),
                             selected=int((~test).sum()),
                             cases=[(w - half, q, t) for w, q, t in cases[kind] if w >= half])  # in windows[half:]
        add_row(ctx, kind, results[kind])
    above = {k: int((r["test"]["target"].mean(0) >= WELL_ABOVE * r["test"]["distance"].mean(0)).sum())
             for k, r in results.items()}
    n_heads = model.config.n_layer * model.config.n_head
    ctx.row("text", f"heads with mean weight >= {WELL_ABOVE:g}x baseline on the target",
            " / ".join(f"{kind}s {above[kind]} of {n_heads}" for kind in KINDS), "- (no attention)",
            f"test windows; baseline: the same head's mean weight at the same distance; the GPT of {run} "
            f"({model.num_params():,} params, {model.config.n_layer} x {model.config.n_embd})")
    evals = read_metrics(run, "eval")  # train.py evaluates at step 0 and at the end, so there are some
    figure(ctx, model, windows[half:], results, tokenizer.decode,
           f"{run.name}: {model.num_params():,} params, {model.config.n_layer} layers x {model.config.n_head} heads, "
           f"{evals[-1]['iter']} iters, best val loss {min(r['val_loss'] for r in evals):.3f}; {len(windows)} windows "
           f"of {T} chars of the stdlib val split: the first {half} pick each kind's best head, the rest give every "
           f"number shown (no training, so no seeds)\ncases: a closing bracket -> its opener; a name's first use after "
           f"its definition (its second-to-last char) -> the definition's last char (scripts/report/text.py); "
           f"baseline: the same head's mean weight at the same distance from the window's other queries")


def add_row(ctx, kind, result):
    layer, head = result["head"]
    test = {k: v[:, layer, head] if v.dim() == 3 else v for k, v in result["test"].items()}
    weight = test["target"]
    spread = 1.96 * weight.std() / len(weight) ** 0.5
    ctx.row("text", f"{kind}: best head's mean weight on {KINDS[kind]} vs same-distance baseline",
            f"{weight.mean():.2f} ± {spread:.2f} vs {test['distance'].mean():.3f} (layer {layer + 1} head {head + 1})",
            "- (no attention)",
            f"{len(weight)} test cases (head picked on {result['selected']} others), ± 95% interval over cases; "
            f"argmax key in {100 * test['argmax'].float().mean():.0f}%; uniform 1/keys {test['uniform'].mean():.3f}; "
            f"the same head puts {test['same_token'].nanmean():.3f} on other keys of the same character and "
            f"{test['previous'].mean():.2f} on the previous token: a head is not one clean concept")


def figure(ctx, model, windows, results, decode, detail):
    """Top: each layer and head's mean weight on the target (its same-distance baseline in brackets); bottom: the best
    head's map on the case of median weight among those at most SHOWN_DISTANCE apart."""
    fig, axes = plt.subplots(2, len(KINDS), figsize=(11, 9.5), gridspec_kw=dict(height_ratios=[1, 1.6]))
    for (kind, result), top, bottom in zip(results.items(), axes[0], axes[1]):
        test, (layer, head) = result["test"], result["head"]
        weight, baseline = test["target"].mean(0), test["distance"].mean(0)  # (L, H)
        top.imshow(weight.numpy(), cmap="Blues", vmin=0, vmax=max(float(weight.max()), 0.1))  # near 0 stays pale
        for (row, h), w in np.ndenumerate(weight.numpy()):  # row: the layer
            top.text(h, row, f"{w:.2f}\n({baseline[row, h]:.2f})", ha="center", va="center", fontsize=7,
                     color="red" if (row, h) == (layer, head) else "black")
        top.set_title(f"{kind}s: weight on {KINDS[kind]}, {len(result['cases'])} test cases\ncell: mean "
                      f"(same-distance baseline); uniform 1/keys {test['uniform'].mean():.3f}\nred: the best head, "
                      f"picked on the other windows", fontsize=8)
        top.set(xlabel="head", ylabel="layer", xticks=range(weight.size(1)), yticks=range(weight.size(0)),
                xticklabels=range(1, weight.size(1) + 1), yticklabels=range(1, weight.size(0) + 1))
        near = [i for i, (_, q, t) in enumerate(result["cases"]) if q - t <= SHOWN_DISTANCE]
        if not near:
            bottom.set_axis_off()
            continue
        shown = sorted(near, key=lambda i: float(test["target"][i, layer, head]))[len(near) // 2]
        w, q, t = result["cases"][shown]
        lo = max(0, t - 3)
        a = model.attention_maps(windows[w:w + 1].to(ctx.device))[layer][0, head, lo:q + 1, lo:q + 1].float().cpu()
        labels = [{"\n": "↵", " ": "·"}.get(c, c) for c in decode(windows[w, lo:q + 1].tolist())]
        bottom.imshow(a.numpy(), cmap="Blues", vmin=0, vmax=1)
        bottom.plot(t - lo, q - lo, "o", mfc="none", mec="red", ms=8)
        bottom.set_xticks(range(len(labels)), labels, fontsize=6)
        bottom.set_yticks(range(len(labels)), labels, fontsize=6)
        bottom.set_title(f"layer {layer + 1} head {head + 1} on its median case: "
                         f"{test['target'][shown, layer, head]:.2f} on {KINDS[kind]} (red circle)", fontsize=8)
        bottom.set(xlabel="key (attended character)", ylabel="query character")
    ctx.save(fig, "text_attention.png", detail)
