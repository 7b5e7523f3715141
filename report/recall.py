"""Recall and induction: can the model look a value up, or copy a repeat, from anywhere in its context?"""
import matplotlib.pyplot as plt
import torch

from checkpoint import build_model

from report.tasks import accuracy, induction_batch, recall_batch, synthetic_models, train_synthetic

BUDGET = {  # what the experiments may spend
    "quick": dict(recall_lrs={"gpt": [3e-3], "lstm": [1e-2]}, recall_steps={"gpt": 1000, "lstm": 600},
                  induction_steps={"gpt": 1000, "lstm": 600}),
    "full": dict(recall_lrs={"gpt": [1e-3, 3e-3], "lstm": [1e-3, 3e-3, 1e-2]}, recall_steps={"gpt": 1000, "lstm": 1500},
                 induction_steps={"gpt": 1500, "lstm": 1500}),
}


def exp_recall(ctx):
    """Multi-query associative recall at 64 tokens: can the model look up, for each query, the value its key had?"""
    pairs, n_keys, warm_steps = (2, 4, 8, 16), 16, 250
    configs = synthetic_models(2 * n_keys + 1, 64)
    results, shown = {}, None
    for name, cfg in configs.items():
        for n in pairs:
            select = {n: recall_batch(256, n, generator=torch.Generator().manual_seed(100 + n))}
            test = recall_batch(1024, n, generator=torch.Generator().manual_seed(200 + n))
            # curriculum: the first warm_steps show 4 pairs, where the look-up circuit forms in ~150 steps
            make = lambda it, g, n=n: recall_batch(64, 4 if it < warm_steps else n, generator=g)
            runs = [(lr, *train_synthetic(cfg, make, BUDGET[ctx.preset]["recall_steps"][name], lr, select, ctx.device))
                    for lr in BUDGET[ctx.preset]["recall_lrs"][name]]
            lr, model, curve = max(runs, key=lambda r: r[2][-1][1][n])  # best lr on the selection set
            results[name, n] = dict(lr=lr, curve=curve, test=accuracy(model, *(t.to(ctx.device) for t in test)))
            print(f"recall {name} {n} pairs: lr {lr:g}, {curve[-1][0]} steps, test {results[name, n]['test']:.3f}")
            if name == "gpt" and n == 8:
                shown = model
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    for name, color in (("gpt", "C0"), ("lstm", "C1")):
        a.plot(pairs, [100 * results[name, n]["test"] for n in pairs], "o-", color=color, label=name)
        for n, style in ((8, "--"), (16, "-")):
            curve = results[name, n]["curve"]
            b.plot([s for s, _ in curve], [100 * acc[n] for _, acc in curve], style, color=color,
                   label=f"{name}, {n} pairs")
    a.plot(pairs, [100 / n_keys] * len(pairs), "k:", lw=0.8, label="chance (1/16)")
    a.set_xscale("log", base=2)
    a.minorticks_off()
    a.set(xlabel="key-value pairs in 64 tokens", ylabel="query accuracy (%)", xticks=pairs, xticklabels=pairs,
          title="multi-query associative recall", ylim=(0, 102))
    b.set(xlabel="training step", ylabel="selection-set accuracy (%)", title="learning curves", ylim=(0, 102))
    for ax in (a, b):
        ax.legend(fontsize=8)
    n_gpt, n_lstm = (build_model(configs[n]).num_params() for n in ("gpt", "lstm"))
    steps = BUDGET[ctx.preset]["recall_steps"]
    ctx.save(fig, "recall.png", f"2-layer GPT ({n_gpt:,} params, width 64) vs 2-layer LSTM ({n_lstm:,}, width "
             f"{configs['lstm'].n_embd}); up to {steps['gpt']} / {steps['lstm']} steps of 64 sequences (first "
             f"{warm_steps} at 4 pairs), lrs {BUDGET[ctx.preset]['recall_lrs']}; runs stop at 99.5%")
    attention_figure(ctx, shown, *recall_batch(1, 8, generator=torch.Generator().manual_seed(7)), 8)
    accs = lambda name: " / ".join(f"{100 * results[name, n]['test']:.0f}" for n in pairs)
    ctx.row("recall", "MQAR accuracy % at 2 / 4 / 8 / 16 pairs (64 tokens)", accs("gpt"), accs("lstm"),
            f"equal size ({n_gpt:,} vs {n_lstm:,}); {steps['gpt']} / {steps['lstm']} steps at most")
    reached = lambda name: " / ".join(str(next((s for s, a in results[name, n]["curve"] if a[n] >= 0.99), "-"))
                                      for n in pairs)
    ctx.row("recall", "steps to 99% at 2 / 4 / 8 / 16 pairs", reached("gpt"), reached("lstm"), "- : not reached")


def attention_figure(ctx, model, x, y, n_pairs):
    maps = model.attention_maps(x.to(ctx.device))  # per layer (1, 1, T, T)
    end = 3 * n_pairs
    fig, axes = plt.subplots(1, 2, figsize=(9, 4.2))
    tokens = x[0, :end].tolist()
    for layer, ax in enumerate(axes):
        ax.imshow(maps[layer][0, 0, :end, :end].cpu(), cmap="Blues", vmin=0, vmax=1)
        ax.set(title=f"layer {layer + 1}", xlabel="attended position (key)", ylabel="position (query)")
        ax.set_xticks(range(end), [str(t) for t in tokens], fontsize=5, rotation=90)
        ax.set_yticks(range(end), [str(t) for t in tokens], fontsize=5)
    for q in range(2 * n_pairs, end):  # circle where each query should look: the value right after its key
        key = tokens[:2 * n_pairs:2].index(tokens[q]) * 2
        axes[1].plot(key + 1, q, "o", mfc="none", mec="red", ms=5)
        axes[0].plot(key, key + 1, "o", mfc="none", mec="red", ms=5)
    fig.suptitle(f"trained GPT on {n_pairs} pairs: layer 1 tags each value with its key (previous token); in layer 2 "
                 f"each query reads the value after its key", fontsize=9)
    ctx.save(fig, "recall_attention.png", "tick labels are token ids (keys 1-16, values 17-32, filler 0); red "
             "circles mark the expected position")


def exp_induction(ctx):
    """A random segment repeated: copying it back needs a previous-token head and an induction head."""
    configs = synthetic_models(33, 64)
    select = {"second copy": induction_batch(256, generator=torch.Generator().manual_seed(300))[:2]}
    test = induction_batch(1024, generator=torch.Generator().manual_seed(400))[:2]
    results = {}
    for name, cfg in configs.items():
        make = lambda it, g: induction_batch(64, generator=g)[:2]
        lr = max(BUDGET[ctx.preset]["recall_lrs"][name])  # 3e-3 for the GPT, 1e-2 for the LSTM: the best on recall
        model, curve = train_synthetic(cfg, make, BUDGET[ctx.preset]["induction_steps"][name], lr, select, ctx.device)
        results[name] = dict(model=model, curve=curve, lr=lr, test=accuracy(model, *(t.to(ctx.device) for t in test)))
        print(f"induction {name}: {curve[-1][0]} steps, test accuracy {results[name]['test']:.3f}")
    x, _, lengths = induction_batch(256, generator=torch.Generator().manual_seed(500))
    maps = results["gpt"]["model"].attention_maps(x.to(ctx.device))
    rows = []  # per sequence: second-copy positions t, the positions before them, and after the earlier copy
    for b, S in enumerate(lengths.tolist()):
        t = torch.arange(S, 2 * S - 1)  # the scored positions: inside the second copy
        rows.append((b, t, t - 1, t - S + 1))
    prev = sum(maps[0][b, 0, t, p].mean().item() for b, t, p, _ in rows) / len(rows)
    induct = sum(maps[1][b, 0, t, s].mean().item() for b, t, _, s in rows) / len(rows)
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for name, color in (("gpt", "C0"), ("lstm", "C1")):
        curve = results[name]["curve"]
        axes[0].plot([s for s, _ in curve], [100 * a["second copy"] for _, a in curve], color=color, label=name)
    axes[0].set(xlabel="training step", ylabel="accuracy on the second copy (%)", title="copying a repeat",
                ylim=(0, 102))
    axes[0].legend(fontsize=8)
    example = int((lengths == 24).nonzero()[0, 0]) if (lengths == 24).any() else 0
    for layer, ax in enumerate(axes[1:]):
        ax.imshow(maps[layer][example, 0].cpu(), cmap="Blues", vmin=0, vmax=1)
        ax.set(xlabel="attended position", ylabel="position", title=(
            f"layer 1: previous token ({100 * prev:.0f}% of weight)" if layer == 0 else
            f"layer 2: induction stripe ({100 * induct:.0f}% of weight)"))
    n_gpt, n_lstm = (results[n]["model"].num_params() for n in ("gpt", "lstm"))
    ctx.save(fig, "induction.png", f"2-layer GPT ({n_gpt:,} params) vs 2-layer LSTM ({n_lstm:,}); segments of "
             f"8-32 distinct tokens out of 32; {results['gpt']['curve'][-1][0]} / {results['lstm']['curve'][-1][0]} "
             f"steps of 64 sequences, lr {results['gpt']['lr']:g} / {results['lstm']['lr']:g}; maps: one sequence "
             f"with a {int(lengths[example])}-token segment")
    ctx.row("induction", "accuracy % on the repeated half", f"{100 * results['gpt']['test']:.1f}",
            f"{100 * results['lstm']['test']:.1f}", f"{results['gpt']['curve'][-1][0]} / "
            f"{results['lstm']['curve'][-1][0]} steps")
    ctx.row("induction", "GPT attention: layer 1 on the previous token / layer 2 on the induction target",
            f"{100 * prev:.0f}% / {100 * induct:.0f}%", "", "averaged over the second copy of 256 sequences")

