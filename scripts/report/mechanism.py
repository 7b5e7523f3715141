"""Why the formula is what it is, and what the path between two tokens means: the √d_k scaling, the sequential
steps and path lengths of Table 1 of "Attention Is All You Need", and the gradient that flows along that path."""
import math

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from attnlab.checkpoint import load_model
from attnlab.config import ModelConfig
from data.corpus import load_split
from model import GPT, manual_attention
from scripts.report.lm import best_run, lm_detail, lm_results
from scripts.report.tasks import VOCAB, lstm_preset


def exp_scaling(ctx):
    """Why softmax(QKᵀ/√d_k): a dot product of two random unit-variance d_k-vectors has variance d_k, so unscaled
    scores grow with the head size and the softmax saturates (Vaswani et al. 2017, section 3.2.1)."""
    gen = torch.Generator().manual_seed(0)
    sizes, var_raw, var_scaled, ent_raw, ent_scaled = [4, 16, 64, 256, 1024], [], [], [], []
    for d in sizes:
        q, k = torch.randn(2000, d, generator=gen), torch.randn(2000, 64, d, generator=gen)  # 64 keys per query
        scores = (k @ q[:, :, None])[..., 0]  # (2000, 64)
        def entropy(s):
            return -(s.softmax(-1) * s.log_softmax(-1)).sum(-1).mean().item() / math.log(64)
        var_raw.append(scores.var().item())
        var_scaled.append((scores / math.sqrt(d)).var().item())
        ent_raw.append(entropy(scores))
        ent_scaled.append(entropy(scores / math.sqrt(d)))
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
    a.loglog(sizes, var_raw, "o-", label="q·k")
    a.loglog(sizes, var_scaled, "s-", label="q·k / √d_k")
    a.loglog(sizes, sizes, "k:", lw=0.8, label="d_k")
    a.set(xlabel="head size d_k", ylabel="variance of the score", title="score variance")
    b.semilogx(sizes, ent_raw, "o-", label="softmax(q·k)")
    b.semilogx(sizes, ent_scaled, "s-", label="softmax(q·k / √d_k)")
    b.set(xlabel="head size d_k", ylabel="entropy / log(64 keys)", title="attention spread over 64 keys", ylim=(0, 1))
    for ax in (a, b):
        ax.legend(fontsize=8)
    ctx.save(fig, "scaling.png", "random q, k ~ N(0, I), 2000 queries x 64 keys per size")
    i = sizes.index(64)
    ctx.row("scaling", "Var(q·k), d_k=64: unscaled / scaled", f"{var_raw[i]:.1f} / {var_scaled[i]:.2f}", "",
            "dot products of unit-variance vectors have variance d_k; /√d_k brings it to 1")
    ctx.row("scaling", "softmax entropy over 64 keys (fraction of uniform), d_k=64: unscaled / scaled",
            f"{ent_raw[i]:.2f} / {ent_scaled[i]:.2f}", "", "unscaled scores saturate the softmax (near one-hot)")
    worked_example(ctx)


WORDS, SCORES = ["The", "bank", "raised", "rates."], [0.2, 1.5, 2.1, 1.8]  # "bank"'s scaled scores q·k/√d_k


def example_weights(scores, d_k=64, causal_row=None):
    """model.py's manual_attention on one query whose scores q·k_j/√d_k against len(scores) keys are `scores` (q is
    √d_k times a unit vector, key j holds scores[j] along it). With causal_row=i only keys 0..i are visible, as in
    our GPT. Returns the weights and the gradient of the largest weight with respect to each key's score."""
    q = torch.zeros(1, 1, 1, d_k)
    q[..., 0] = math.sqrt(d_k)
    k = torch.zeros(1, 1, len(scores), d_k)
    k[0, 0, :, 0] = torch.tensor(scores)
    k.requires_grad_(True)
    mask = None if causal_row is None else (torch.arange(len(scores)) <= causal_row)[None, None, None]
    _, weights = manual_attention(q, k, torch.eye(len(scores), d_k)[None, None], mask, is_causal=False)
    weights = weights[0, 0, 0]
    weights.max().backward()
    return weights.detach(), k.grad[0, 0, :, 0]  # ∂ max weight / ∂ score_j = p_max (δ_j,max - p_j)


def worked_example(ctx):
    """The explainers' sentence, through our own attention code: "bank" reading "The bank raised rates." (scores
    as explainers give them; no causal mask, as in their encoder picture), then in our causal GPT, then without the
    1/√d_k (the same q and k, scores 8x larger at d_k = 64): the weights saturate and the gradient shrinks."""
    d_k = 64
    scaled, grad_scaled = example_weights(SCORES, d_k)
    causal, _ = example_weights(SCORES, d_k, causal_row=WORDS.index("bank"))
    raw, grad_raw = example_weights([s * math.sqrt(d_k) for s in SCORES], d_k)
    def show(w):
        return " / ".join(f"{x:.3f}" for x in w.tolist())
    lines = [f"| {WORDS[1]!r} attends to | " + " | ".join(WORDS) + " |", "|---" * (len(WORDS) + 1) + "|",
             "| scaled scores q·k/√d_k | " + " | ".join(f"{s:.1f}" for s in SCORES) + " |",
             "| softmax, all four words visible | " + " | ".join(f"{w:.3f}" for w in scaled.tolist()) + " |",
             "| softmax, causal (our GPT) | " + " | ".join(f"{w:.3f}" for w in causal.tolist()) + " |",
             f"| softmax without /√d_k (scores x{math.sqrt(d_k):.0f}) | " +
             " | ".join(f"{w:.3f}" for w in raw.tolist()) + " |"]
    first = WORDS.index("The")
    (ctx.out / "worked_example.md").write_text(
        "# The worked example: softmax(QKᵀ/√d_k) for one word, computed by model.py's manual_attention\n\n"
        + "\n".join(lines) + f"\n\nThe gradient of the largest weight with respect to the score of {WORDS[first]!r}: "
        f"{grad_scaled[first]:.4f} with the scaling, {grad_raw[first]:.1e} without: a saturated softmax stops "
        "learning from every key but its favourite. Explainers round the first row to 0.07 / 0.25 / 0.37 / 0.31.\n")
    ctx.row("scaling", "worked example: 'bank' on The / bank / raised / rates. (scores 0.2 / 1.5 / 2.1 / 1.8)",
            show(scaled), "", f"causal: {show(causal[:2])}; without /√d_k: {show(raw)} (worked_example.md)")
    ctx.row("scaling", "worked example: ∂ top weight / ∂ score of 'The', scaled / unscaled (d_k=64)",
            f"{grad_scaled[first]:.4f} / {grad_raw[first]:.1e}", "", "a saturated softmax passes almost no gradient")


def autograd_depth(output):
    """The longest chain of dependent operations from any input to output: the steps no parallelism can skip."""
    depth, order, stack, seen = {}, [], [(output.grad_fn, False)], set()
    while stack:  # iterative post-order: the graph of a 4096-step recurrence is too deep for recursion
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if node is None or node in seen:
            continue
        seen.add(node)
        stack.append((node, True))
        stack.extend((child, False) for child, _ in node.next_functions)
    for node in order:
        children = [depth.get(child, 0) for child, _ in node.next_functions if child is not None]
        depth[node] = 1 + max(children, default=0)
    return depth[output.grad_fn]


def max_hops(length, reads):
    """The path between the first and the last token (the farthest pair in a causal layer), counted by breadth-first
    search when position i feeds positions reads(i, length) in one step."""
    seen, frontier, hops = {0}, {0}, 0
    while length - 1 not in seen:
        frontier = {j for i in frontier for j in reads(i, length)} - seen
        seen |= frontier
        hops += 1
    return hops


def exp_paths(ctx):
    """Table 1 of "Attention Is All You Need", counted on our layers: work per layer, sequential operations and the
    path between the first and the last token; then the gradient that actually flows along that path."""
    gpt_cfg, lstm_cfg = ModelConfig(vocab_size=VOCAB, block_size=4096), lstm_preset(VOCAB)
    C, H = gpt_cfg.n_embd, lstm_cfg.n_embd
    block = GPT(gpt_cfg).transformer.h[0]
    cell = torch.nn.LSTMCell(H, H)  # the fused nn.LSTM hides its steps from autograd; the cell loop shows them
    table = []
    for T in (64, 256, 1024, 4096):
        x = torch.randn(1, T, C, requires_grad=True)
        gpt_depth = autograd_depth(block(x).sum())
        h = c = torch.zeros(1, H)
        inputs = torch.randn(T, 1, H, requires_grad=True)
        for t in range(T):
            h, c = cell(inputs[t], (h, c))
        lstm_depth = autograd_depth(h.sum())
        gpt_flops = 2 * T * C * (3 * C + C + 8 * C) + 4 * T * T * C  # projections and MLP, then QKᵀ and AV
        lstm_flops = 2 * T * 4 * H * 2 * H  # four gates, each from x_t and h_{t-1}
        attention_hops = max_hops(T, lambda i, n: range(i + 1, n))  # each query reads every earlier key
        recurrent_hops = max_hops(T, lambda i, n: [i + 1] if i + 1 < n else [])  # h_t reads h_{t-1} only
        table.append((T, gpt_flops, lstm_flops, gpt_depth, lstm_depth, attention_hops, recurrent_hops))
    with open(ctx.out / "paths.md", "w") as f:
        f.write(f"| T | FLOPs/layer GPT (C={C}) | FLOPs/layer LSTM (H={H}) | sequential ops GPT | sequential ops LSTM "
                f"| max path GPT | max path LSTM |\n|---|---|---|---|---|---|---|\n")
        for T, gf, lf, gd, ld, ah, rh in table:
            f.write(f"| {T} | {gf / 1e6:,.0f}M | {lf / 1e6:,.0f}M | {gd} | {ld:,} | {ah} | {rh:,} |\n")
    for T, gf, lf, gd, ld, ah, rh in table[::3]:
        ctx.row("paths", f"sequential ops per layer (autograd depth), T={T}", gd, f"{ld:,}", "O(1) vs O(T)")
        ctx.row("paths", f"max path between two tokens (hops per layer), T={T}", ah, f"{rh:,}", "O(1) vs O(T)")
        ctx.row("paths", f"FLOPs per layer, T={T}", f"{gf / 1e6:,.0f}M", f"{lf / 1e6:,.0f}M",
                "attention pays T² in work for its O(1) path")
    gradient_paths(ctx)


def gradient_paths(ctx):
    """|∂ loss at the last position / ∂ embedding at t| against the distance T - t, for fresh and trained models:
    what the path length means for learning (Bengio et al. 1994; Hochreiter 1991)."""
    result = lm_results(ctx)  # the lm experiment's models, trained first where they are not there
    fig, ax = plt.subplots(figsize=(7, 4))
    ratios = {}
    for name in ("gpt", "lstm"):
        trained_model, _ = load_model(best_run(ctx, name))
        torch.manual_seed(0)
        fresh_model = type(trained_model)(trained_model.config).eval()  # the same architecture, untrained
        T, val = trained_model.config.block_size, load_split(result.plan.data_dir, "val")
        starts = torch.linspace(0, len(val) - T - 2, 32).long()
        windows = torch.stack([torch.from_numpy(val[s:s + T + 1].astype("int64")) for s in starts])
        for trained, model in ((False, fresh_model), (True, trained_model)):
            embedding = model.transformer.wte if isinstance(model, GPT) else model.wte
            captured = []  # the embedding output: a forward hook returning None keeps it as it is
            hook = embedding.register_forward_hook(lambda m, i, out: captured.append(out) or out.retain_grad())
            logits = model(windows[:, :-1])[0]
            hook.remove()
            F.cross_entropy(logits[:, -1], windows[:, -1]).backward()
            norms = captured[0].grad.norm(dim=-1).mean(0).flip(0)  # (T,): index = distance from the last token
            ax.semilogy(norms.numpy(), "-" if trained else ":", color="C0" if name == "gpt" else "C1",
                        label=f"{name} {'trained' if trained else 'untrained'}")
            if trained:
                ratios[name] = (norms[-16:].mean() / norms[1:17].mean()).item()
    ax.set(xlabel="distance T - t (tokens)", ylabel="|∂ loss_T / ∂ embedding_t|, mean of 32 windows",
           title="how strongly the last prediction's gradient reaches each earlier token")
    ax.legend(fontsize=8)
    ctx.save(fig, "gradient_paths.png", lm_detail(result))
    ctx.row("paths", "trained: gradient reaching the 16 farthest / the 16 nearest tokens", f"{ratios['gpt']:.2g}",
            f"{ratios['lstm']:.2g}", "through a recurrence the gradient shrinks with distance")

