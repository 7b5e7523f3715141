"""See a trained model on your own text: one self-contained HTML page of what each attention head looks at, and where
one model predicts the text better than another, token by token.

    python -m scripts.attention out_dir=out text="def add(a, b): return a + b"   # the page: out/attention.html
    python -m scripts.attention out_dir=out text_file=notes.txt compare=out/lstm  # a GPT against an LSTM

The page shows the text's tokens and every layer x head as a small map of its attention, labelled with the head's
previous-token and induction scores (attnlab/heads.py); hovering a token shows where each head looks from it (a click
holds it). Each token's loss colours the text, and with compare= the difference between the two models does, beside
both losses by position. An RNN has no attention to show: its page is the loss view. The text is read as
scripts.evaluate scores it, in consecutive windows of the model's block_size, each from a fresh start. Script, style
and data are inline and the page's Content-Security-Policy forbids any request, so it opens offline.
"""
import base64
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import hydra
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from attnlab.checkpoint import load_model
from attnlab.cli import one_line_errors, quote_free_text, run_cli
from attnlab.config import CONFIG_DIR, AttentionConfig, register_configs
from attnlab.heads import head_scores
from attnlab.runtime import autocast, autocast_dtype, pick_device
from data.corpus import decode_utf8
from data.tokenizers import load_tokenizer
from model import GPT

register_configs()

TOP_KEYS = 16  # keys kept per head and query, its largest weights: enough to draw a map, light enough for 12 x 12 heads
LEVELS = 255  # a weight is stored in 1/255ths (one byte); a smaller one is left out
RNN_NAMES = {"lstm": "an LSTM", "gru": "a GRU", "mingru": "a minGRU"}


@dataclass
class Reading:
    """One model's reading of the text."""
    out_dir: str
    kind: str  # gpt | lstm | gru | mingru
    block_size: int  # the window it reads the text in
    losses: torch.Tensor  # (N - 1,) nats of each token after the first


def read_text(cfg: AttentionConfig):
    """The text cfg names and how to name it in a message."""
    if cfg.text_file is not None:
        path = Path(cfg.text_file)
        if not path.is_file():
            raise FileNotFoundError(f"text_file={cfg.text_file} does not exist; pass a UTF-8 text file")
        return decode_utf8(path.read_bytes(), f"text_file={cfg.text_file}"), f"text_file={cfg.text_file}"
    if cfg.text is None:
        raise ValueError('no text to read; pass text="..." or text_file=FILE')
    return cfg.text, "text"


def tokenizer_name(meta):
    spec = meta["tokenizer"]
    return f"{len(spec['chars'])} characters" if spec["type"] == "char" else f"{spec['type']} tokens"


def same_tokenizer(meta_a, meta_b):
    """Whether two runs cut a text into the same tokens (a gpt2 ranks file may sit at another path)."""
    def spec(meta):
        return {key: value for key, value in meta["tokenizer"].items() if key != "bpe_file"}
    return spec(meta_a) == spec(meta_b)


def kind(model):
    return "gpt" if isinstance(model, GPT) else model.config.type


def windows(n, block_size):
    """The first position of each consecutive window of block_size tokens over n, as scripts.evaluate scores them."""
    return list(range(0, n, block_size))


@torch.no_grad()
def token_losses(model, ids, amp):
    """(N - 1,) nats of each token of ids (N,) after the first, predicted from the tokens before it in its window."""
    device = next(model.parameters()).device
    block_size = model.config.block_size
    losses = []
    for start in windows(len(ids) - 1, block_size):
        window = ids[start:start + block_size + 1].to(device)
        with amp:
            logits, _ = model(window[None, :-1])
        losses.append(F.cross_entropy(logits[0].float(), window[1:], reduction="none").cpu())
    return torch.cat(losses)


@torch.no_grad()
def attention_rows(model, ids, amp):
    """Each head's attention from every token of ids (N,), as sparse rows: for each layer, head and query in that
    order, its TOP_KEYS largest weights, largest first, in 1/LEVELS (those that round to 0 left out). Returns starts
    (L * H * N + 1,) into keys (positions in the text) and weights."""
    device = next(model.parameters()).device
    keys, weights = [], []
    for start in windows(len(ids), model.config.block_size):
        window = ids[start:start + model.config.block_size].to(device)
        with amp:
            maps = model.attention_maps(window[None])
        a = torch.cat(maps).float().cpu()  # (L, H, T, T)
        a = F.pad(a, (0, max(0, TOP_KEYS - a.size(-1))))  # a window shorter than TOP_KEYS: padded with zero weights
        top = a.topk(TOP_KEYS, dim=-1)  # (L, H, T, TOP_KEYS)
        weights.append((top.values * LEVELS).round().to(torch.uint8))
        keys.append(top.indices + start)
    weights = torch.cat(weights, 2).flatten(0, 2)  # (L * H * N, TOP_KEYS)
    keys = torch.cat(keys, 2).flatten(0, 2)
    kept = weights > 0
    starts = F.pad(kept.sum(1).cumsum(0), (1, 0))
    return starts.numpy().astype("<u4"), keys[kept].numpy().astype("<u2"), weights[kept].numpy()


def packed(array):
    """A little-endian numpy array as base64, for a typed array in the page."""
    return base64.b64encode(array.tobytes()).decode("ascii")


def losses_json(reading):
    """Each token's loss in nats, 3 decimals; the first token has none."""
    return [None] + [round(x, 3) for x in reading.losses.tolist()]


def load_runs(cfg: AttentionConfig, device):
    """[(out_dir, model)] for out_dir and compare, and out_dir's meta (the tokenizer); refuses two runs whose tokens
    differ, as their losses would not line up."""
    model, meta = load_model(cfg.out_dir, cfg.checkpoint, device)
    if cfg.compare is None:
        return [(cfg.out_dir, model)], meta
    other, other_meta = load_model(cfg.compare, cfg.checkpoint, device)
    if not same_tokenizer(meta, other_meta):
        raise ValueError(f"out_dir={cfg.out_dir} ({tokenizer_name(meta)}) and compare={cfg.compare} "
                         f"({tokenizer_name(other_meta)}) cut text into different tokens, so their losses do not line "
                         f"up token by token; compare two runs trained with the same data settings")
    return [(cfg.out_dir, model), (cfg.compare, other)], meta


def text_ids(text, source, tokenizer, max_tokens, notes):
    """(N,) token ids of text, at most max_tokens of them (a note says when it was cut)."""
    if not text:
        raise ValueError(f"{source} is empty; pass the text to read")
    ids = tokenizer.encode(text, name=source)
    if len(ids) < 2:
        raise ValueError(f"{source} holds {len(ids)} token(s) but the page needs 2 or more (the first is only "
                         f"context); pass a longer text")
    if len(ids) > max_tokens:
        notes.append(f"the text's {len(ids):,} tokens are cut to its first {max_tokens:,} (max_tokens)")
    return torch.tensor(ids[:max_tokens])


def read(out_dir, model, ids, amp, notes):
    """model's Reading of ids; a note says how a text longer than its context was read."""
    block_size = model.config.block_size
    if len(ids) > block_size:
        fresh = "from a fresh start: a token sees only those before it in its window"
        if kind(model) != "gpt":
            fresh = "from a zero state, as it trained"
        notes.append(f"{out_dir} reads the {len(ids):,} tokens in {len(windows(len(ids), block_size))} windows of "
                     f"its block_size={block_size}, each {fresh}")
    return Reading(out_dir, kind(model), block_size, token_losses(model, ids, amp))


def attention_data(out_dir, model, ids, seed, amp):
    """The page's view of a GPT's heads: their scores and their sparse rows of attention over ids."""
    with amp:
        previous, induction = head_scores(model, seed)
    starts, keys, weights = attention_rows(model, ids, amp)
    return {"out_dir": out_dir, "layers": model.config.n_layer, "heads": model.config.n_head,
            "block_size": model.config.block_size, "top_keys": TOP_KEYS,
            "previous": previous.double().round(decimals=3).tolist(),
            "induction": induction.double().round(decimals=3).tolist(),
            "starts": packed(starts), "keys": packed(keys), "weights": packed(weights)}


def no_attention_line(readings):
    which = " and ".join(f"{r.out_dir} is {RNN_NAMES[r.kind]}" for r in readings)
    return (f"{which}: a recurrent network folds each token into a state of fixed size and keeps no weights over "
            f"earlier positions, so it has no attention to show; the loss on each token is below.")


def write_page(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    page = PAGE.replace("__DATA__", json.dumps(data).replace("<", "\\u003c"))  # no "</script>" can end the data early
    path.write_text(page, encoding="utf-8")


def attention_page(cfg: AttentionConfig, err=None) -> Path:
    """Write the page cfg describes; says on err (stderr) how the text was read. Returns the page's path."""
    err = sys.stderr if err is None else err
    device = pick_device(cfg.device)
    amp = autocast(device, autocast_dtype(device, cfg.dtype))
    text, source = read_text(cfg)
    models, meta = load_runs(cfg, device)
    tokenizer = load_tokenizer(meta)
    notes = []
    ids = text_ids(text, source, tokenizer, cfg.max_tokens, notes)
    readings = [read(out_dir, model, ids, amp, notes) for out_dir, model in models]
    for note in notes:
        print(note, file=err)
    gpts = [(out_dir, model) for out_dir, model in models if isinstance(model, GPT)]
    attention = attention_data(*gpts[0], ids, cfg.seed, amp) if gpts else None  # out_dir's heads where it has some
    data = {"title": " vs ".join(f"{r.out_dir} ({r.kind})" for r in readings), "source": source, "notes": notes,
            "tokens": [tokenizer.decode([i]) for i in ids.tolist()], "attention": attention,
            "no_attention": None if gpts else no_attention_line(readings),
            "models": [{"out_dir": r.out_dir, "kind": r.kind, "block_size": r.block_size, "losses": losses_json(r),
                        "mean": round(r.losses.mean().item(), 4)} for r in readings]}
    path = Path(cfg.page) if cfg.page is not None else Path(cfg.out_dir) / "attention.html"
    write_page(path, data)
    print(f"wrote {path} ({path.stat().st_size:,} bytes); open it in a browser")
    return path


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="attention")
@one_line_errors
def main(dict_cfg):
    attention_page(OmegaConf.to_object(dict_cfg))


# The page: inline style, script and data (JSON in a script element, the attention as base64 typed arrays); vanilla JS
# draws each head's map on a canvas from the sparse rows, for the window of the token under the pointer.
PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy"
      content="default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'">
<title>attnlab: attention</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 12px 16px; color: #222; }
h1 { font-size: 17px; margin: 0 0 4px; }
p { margin: 3px 0; }
.note { color: #666; }
#main { display: flex; gap: 16px; align-items: flex-start; margin-top: 6px; }
#left { flex: 1 1 48%; min-width: 0; }
#right { flex: 1 1 52%; min-width: 0; }
#text { font: 12px/1.55 ui-monospace, Menlo, Consolas, monospace; white-space: pre-wrap; word-break: break-all;
        max-height: 55vh; overflow-y: auto; border: 1px solid #ccc; padding: 6px; }
.tok { cursor: pointer; }
.tok.query { outline: 2px solid #e6550d; }
.tok.start { box-shadow: -2px 0 0 #aaa; }
.nl { color: #bbb; }
#key { color: #666; margin: 2px 0; }
#status { font: 12px ui-monospace, Menlo, Consolas, monospace; min-height: 1.5em; margin: 4px 0; white-space: pre; }
#heads { display: grid; gap: 3px; justify-content: start; }
.head { font-size: 10px; line-height: 1.2; text-align: center; cursor: pointer; border: 2px solid transparent; }
.head.selected { border-color: #e6550d; }
.head canvas { width: 100%; display: block; image-rendering: pixelated; outline: 1px solid #ddd; }
#plot { width: 100%; height: 170px; display: block; margin-top: 8px; }
.key { display: inline-block; width: 10px; height: 10px; margin: 0 3px 0 10px; }
#gains { font: 12px ui-monospace, Menlo, Consolas, monospace; white-space: pre; margin-top: 6px; }
#gains div { cursor: pointer; }
#gains b { background: #fdd0a2; font-weight: normal; }
</style>
</head>
<body>
<h1 id="title"></h1>
<div id="notes"></div>
<p id="modes">colour the text by
  <label><input type="radio" name="mode" value="attention"> the selected head's attention from the token under the
    pointer</label>
  <label><input type="radio" name="mode" value="loss"> loss</label>
  <label><input type="radio" name="mode" value="diff"> loss difference</label></p>
<div id="key"></div>
<div id="status"></div>
<div id="main">
  <div id="left"><div id="text"></div><canvas id="plot"></canvas><div id="legend"></div><div id="gains"></div></div>
  <div id="right"><p id="about"></p><div id="heads"></div></div>
</div>
<script type="application/json" id="data">__DATA__</script>
<script>
"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const A = D.attention;  // null for an RNN
const N = D.tokens.length;
const BLOCK = A ? A.block_size : D.models[0].block_size;  // the windows the text marks
const COLORS = ["33,113,181", "230,85,13"];  // the first model blue, the compared one orange
const MAP_PX = 128;  // a head's map is at most this many pixels a side; a longer window is binned (max per bin)
const SMOOTH = 16;  // the loss plot's running mean, in tokens
const el = id => document.getElementById(id);
let query = null;  // the token under the pointer, or the one clicked
let pinned = false;  // a click holds the query until the next click
let mode = D.models.length > 1 ? "diff" : (A ? "attention" : "loss");  // what a compare= page is for, first

function bytes(b64) {
  const s = atob(b64);
  const a = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) a[i] = s.charCodeAt(i);
  return a;
}
const starts = A && new Uint32Array(bytes(A.starts).buffer);
const keys = A && new Uint16Array(bytes(A.keys).buffer);
const weights = A && bytes(A.weights);
const nHeads = A ? A.layers * A.heads : 0;
let selected = 0;  // the head whose attention colours the text: at first the one with the highest score
for (let h = 0; h < nHeads; h++) if (bestScore(h) > bestScore(selected)) selected = h;

function score(name, h) { return A[name][Math.floor(h / A.heads)][h % A.heads]; }
function bestScore(h) { return Math.max(score("previous", h), score("induction", h)); }
function row(h, q) {  // [[key, weight], ...] of head h from query q, largest first
  const out = [];
  for (let i = starts[h * N + q]; i < starts[h * N + q + 1]; i++) out.push([keys[i], weights[i] / 255]);
  return out;
}
function windowOf(q) {  // [first, end) of the attention window holding token q
  const lo = Math.floor(q / A.block_size) * A.block_size;
  return [lo, Math.min(N, lo + A.block_size)];
}
function loss(m, i) { return D.models[m].losses[i]; }
function diff(i) { return loss(1, i) - loss(0, i); }  // > 0: the first model predicts token i better
function quantile(values, p) {
  const v = values.filter(x => x !== null).sort((a, b) => a - b);
  return v.length ? v[Math.min(v.length - 1, Math.floor(p * v.length))] : 1;
}

// ----- the text
const spans = D.tokens.map((t, i) => {
  const s = document.createElement("span");
  s.className = "tok";
  s.dataset.i = i;
  if (t === "\\n") s.innerHTML = '<span class="nl">\\u21b5</span>\\n';
  else s.textContent = t;
  if (i > 0 && i % BLOCK === 0) s.classList.add("start");
  el("text").appendChild(s);
  return s;
});
const lossScale = quantile(D.models.flatMap(m => m.losses), 0.95);
const diffScale = D.models.length > 1 ? quantile(D.tokens.map((_, i) => i ? Math.abs(diff(i)) : null), 0.95) : 1;

function paint() {
  for (const s of spans) { s.style.background = ""; s.classList.remove("query"); }
  if (mode === "attention" && A && query !== null) {
    for (const [k, w] of row(selected, query)) spans[k].style.background = `rgba(${COLORS[0]},${w})`;
  } else if (mode === "loss") {
    spans.forEach((s, i) => { if (i) s.style.background = `rgba(203,24,29,${Math.min(1, loss(0, i) / lossScale)})`; });
  } else if (mode === "diff" && D.models.length > 1) {
    spans.forEach((s, i) => {
      if (i) s.style.background = `rgba(${COLORS[diff(i) > 0 ? 0 : 1]},${Math.min(1, Math.abs(diff(i)) / diffScale)})`;
    });
  }
  if (query !== null) spans[query].classList.add("query");
}

// ----- the heads
const cache = new Map();  // (head, window) -> its map, drawn once
function mapImage(h, lo, hi) {
  const name = h + ":" + lo;
  if (cache.has(name)) return cache.get(name);
  const S = Math.min(hi - lo, MAP_PX);
  const bin = S / (hi - lo);
  const shade = new Float32Array(S * S);
  for (let q = lo; q < hi; q++) {
    for (const [k, w] of row(h, q)) {
      const i = Math.floor((q - lo) * bin) * S + Math.floor((k - lo) * bin);
      shade[i] = Math.max(shade[i], w);
    }
  }
  const c = document.createElement("canvas");
  c.width = c.height = S;
  const ctx = c.getContext("2d");
  const img = ctx.createImageData(S, S);
  for (let i = 0; i < S * S; i++) {
    const v = Math.sqrt(shade[i]);  // a square root keeps a head that spreads its weight visible
    img.data.set([255 - 222 * v, 255 - 142 * v, 255 - 74 * v, 255], 4 * i);
  }
  ctx.putImageData(img, 0, 0);
  cache.set(name, c);
  return c;
}
const canvases = [];
if (A) {
  el("heads").style.gridTemplateColumns = `repeat(${A.heads}, minmax(0, 136px))`;
  el("about").textContent = `${A.out_dir}: ${A.layers} layers x ${A.heads} heads (rows: layers, first at the top). ` +
    "Each map is one head's attention in the window of the token under the pointer: a row per query, a column per " +
    "key, darker for more weight (its largest " + A.top_keys + " per query drawn); the orange row is the token. " +
    "prev and ind: the head's mean weight on the previous token and on the token after an earlier occurrence " +
    "(induction), on random tokens repeated twice. Click a head to colour the text by it.";
  for (let h = 0; h < nHeads; h++) {
    const cell = document.createElement("div");
    cell.className = "head";
    cell.title = `layer ${Math.floor(h / A.heads)}, head ${h % A.heads}: previous-token score ` +
      `${score("previous", h).toFixed(2)}, induction score ${score("induction", h).toFixed(2)}`;
    const c = document.createElement("canvas");
    const label = document.createElement("div");
    label.innerText = `L${Math.floor(h / A.heads)} H${h % A.heads}\nprev ${score("previous", h).toFixed(2)} ` +
      `ind ${score("induction", h).toFixed(2)}`;
    cell.append(c, label);
    cell.addEventListener("click", () => { selected = h; mode = "attention"; update(); });
    el("heads").appendChild(cell);
    canvases.push(c);
  }
} else {
  el("about").textContent = D.no_attention;
}
function drawHeads() {
  if (!A) return;
  const [lo, hi] = windowOf(query === null ? 0 : query);
  canvases.forEach((c, h) => {
    const img = mapImage(h, lo, hi);
    c.width = c.height = img.width;
    const ctx = c.getContext("2d");
    ctx.drawImage(img, 0, 0);
    if (query !== null) {
      const bin = img.width / (hi - lo);
      const y = Math.floor((query - lo) * bin);
      ctx.fillStyle = "rgba(230,85,13,0.25)";
      ctx.fillRect(0, y, img.width, 1);
      for (const [k, w] of row(h, query)) {
        ctx.fillStyle = `rgba(230,85,13,${0.3 + 0.7 * w})`;
        ctx.fillRect(Math.floor((k - lo) * bin), y, 1, 1);
      }
    }
    c.parentNode.classList.toggle("selected", h === selected);
  });
}

// ----- loss by position
function smoothed(m) {
  const out = [];
  let sum = 0, n = 0;
  for (let i = 1; i < N; i++) {
    sum += loss(m, i); n++;
    if (i > SMOOTH) { sum -= loss(m, i - SMOOTH); n--; }
    out.push([i, sum / n]);
  }
  return out;
}
const curves = D.models.map((_, m) => smoothed(m));
const ceiling = Math.max(...curves.flat().map(p => p[1])) * 1.05;
function drawPlot() {
  const c = el("plot");
  const ratio = window.devicePixelRatio || 1;
  c.width = c.clientWidth * ratio;
  c.height = c.clientHeight * ratio;
  const ctx = c.getContext("2d");
  ctx.scale(ratio, ratio);
  const W = c.clientWidth, H = c.clientHeight, pad = 30;
  const x = i => pad + (W - pad - 4) * i / Math.max(1, N - 1);
  const y = v => H - 16 - (H - 24) * v / ceiling;
  ctx.font = "10px sans-serif";
  ctx.fillStyle = "#666";
  ctx.fillText(`loss (nats), mean of ${SMOOTH} tokens`, pad + 4, 10);
  ctx.fillText("0", 4, y(0));
  ctx.fillText(ceiling.toFixed(1), 4, y(ceiling) + 8);
  ctx.fillText("position in the text", W - 110, H - 3);
  D.models.forEach((m, k) => {
    ctx.strokeStyle = `rgba(${COLORS[k]},0.25)`;
    for (let i = m.block_size; i < N; i += m.block_size) {  // each window starts afresh
      ctx.beginPath(); ctx.moveTo(x(i), y(0)); ctx.lineTo(x(i), y(ceiling)); ctx.stroke();
    }
  });
  curves.forEach((points, k) => {
    ctx.strokeStyle = `rgb(${COLORS[k]})`;
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    points.forEach(([i, v], j) => j ? ctx.lineTo(x(i), y(v)) : ctx.moveTo(x(i), y(v)));
    ctx.stroke();
  });
  if (query !== null) {
    ctx.strokeStyle = "#000";
    ctx.lineWidth = 1;
    ctx.beginPath(); ctx.moveTo(x(query), y(0)); ctx.lineTo(x(query), y(ceiling)); ctx.stroke();
  }
}
el("legend").innerHTML = D.models.map((m, k) => `<span class="key" style="background:rgb(${COLORS[k]})"></span>` +
  `${m.out_dir} (${m.kind}): ${m.mean.toFixed(3)} nats/token`).join("");

// ----- where one model beats the other most
function excerpt(i) {
  const show = t => t.replace(/\\n/g, "\\u21b5");
  const before = show(D.tokens.slice(Math.max(0, i - 24), i).join("")).slice(-24).padStart(24);
  const after = show(D.tokens.slice(i + 1, i + 12).join("")).slice(0, 12);
  return [before, show(D.tokens[i]), after];
}
if (D.models.length > 1) {
  const order = D.tokens.map((_, i) => i).slice(1).sort((a, b) => diff(b) - diff(a));
  const lists = [[D.models[0], D.models[1], order.slice(0, 8)], [D.models[1], D.models[0], order.slice(-8).reverse()]];
  for (const [better, worse, picks] of lists) {
    const head = document.createElement("p");
    head.textContent = `where ${better.out_dir} predicts better than ${worse.out_dir} most (nats):`;
    el("gains").appendChild(head);
    for (const i of picks) {
      const [before, token, after] = excerpt(i);
      const line = document.createElement("div");
      line.append(`${Math.abs(diff(i)).toFixed(2).padStart(6)}  ${before}`);
      const b = document.createElement("b");
      b.textContent = token;
      line.append(b, after);
      line.addEventListener("click", () => { pinned = true; setQuery(i); spans[i].scrollIntoView({block: "center"}); });
      el("gains").appendChild(line);
    }
  }
}

// ----- wiring
function statusLine() {
  if (query === null) return "hover over a token (click to hold it)";
  const parts = [`token ${query} ${JSON.stringify(D.tokens[query])}`];
  if (query > 0) parts.push(D.models.map(m => `${m.out_dir} ${m.losses[query].toFixed(2)}`).join("  ") + " nats");
  if (query > 0 && D.models.length > 1) parts.push(`difference ${diff(query).toFixed(2)}`);
  return parts.join("   ");
}
function colourKey() {
  const [a, b] = D.models.map(m => m.out_dir);
  if (mode === "attention") {
    return `blue: the weight head L${Math.floor(selected / A.heads)} H${selected % A.heads} puts on each token ` +
      "from the outlined one";
  }
  if (mode === "diff") return `blue: ${a} predicts the token better, orange: ${b} does (darker: by more)`;
  return `red: ${a}'s loss on the token (darker: higher)`;
}
function update() {
  for (const r of document.querySelectorAll("input[name=mode]")) r.checked = r.value === mode;
  paint();
  drawHeads();
  drawPlot();
  el("key").textContent = colourKey();
  el("status").textContent = statusLine();
  document.body.dataset.query = query === null ? "" : query;
}
function setQuery(i) { query = i; update(); }
el("text").addEventListener("mouseover", e => {
  const t = e.target.closest(".tok");
  if (t && !pinned) setQuery(+t.dataset.i);
});
el("text").addEventListener("click", e => {
  const t = e.target.closest(".tok");
  if (!t) return;
  pinned = !(pinned && query === +t.dataset.i);
  setQuery(+t.dataset.i);
});
for (const r of document.querySelectorAll("input[name=mode]")) {
  r.disabled = (r.value === "attention" && !A) || (r.value === "diff" && D.models.length < 2);
  r.addEventListener("change", () => { mode = r.value; update(); });
}
el("title").textContent = `${D.title} on ${D.source} (${N} tokens)`;
const notes = D.notes.concat(N > BLOCK ? ["a grey bar in the text marks where a window starts"] : []);
for (const note of notes) {
  const p = document.createElement("p");
  p.className = "note";
  p.textContent = note;
  el("notes").appendChild(p);
}
window.addEventListener("resize", drawPlot);
query = D.models.length > 1 ? D.tokens.map((_, i) => i).slice(1).reduce((a, b) => diff(b) > diff(a) ? b : a) :
  Math.floor(N / 2);  // a token to start from: where the first model gains most, or the middle
update();
</script>
</body>
</html>
"""


if __name__ == "__main__":
    quote_free_text(sys.argv, "text")
    run_cli(main, help_script="-m scripts.attention")
