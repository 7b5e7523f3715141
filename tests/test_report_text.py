"""scripts/report/text.py: the case finders on hand-written code, the measure on maps whose attention is known, and the
experiment end to end on a tiny GPT trained on the stdlib corpus."""
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab.config import Config, DataConfig, ModelConfig, TrainConfig
from scripts.report import Context, text
from train import train

BRACKETS = ('def f(a, b=(1, 2)):\n'
            '    s = "(]" + \')\'  # ) in a comment (\n'
            r'    print("(\")", s, """a ")" b""")' '\n'  # an escaped quote, a bracket in a triple-quoted string
            '    return [a[0], {"k": b}]\n')
NAMES = ("import os\n"
         "def load(path, mode='r'):\n"
         "    print(total, 'loop for each row')\n"
         "    total = 1\n"
         "    data = open(path, mode)\n"
         "    for line in data:\n"
         "        print(line, os, total, each)\n"
         "    else: done = True\n"
         "    value=2\n"
         "    if done: print(value)\n"
         "    else: print(load)\n")


def test_brackets_match_across_nesting_and_skip_strings_and_comments():
    found = {BRACKETS[t:q + 1] for q, t in text.bracket_cases(BRACKETS)}
    assert found == {"(1, 2)", "(a, b=(1, 2))", r'("(\")", s, """a ")" b""")', "[0]", '{"k": b}', '[a[0], {"k": b}]'}
    assert all(BRACKETS[q] in ")]}" and q - t >= 2 for q, t in text.bracket_cases(BRACKETS))


def test_unmatched_and_empty_brackets_are_dropped():
    # a closer whose opener is before the text, an empty pair, a mismatch (the stack starts afresh, so the last
    # closer finds no opener), then a pair
    assert text.bracket_cases("x) + f() + g(y] + (ab) + z)") == [(21, 18)]


def name_case(code, definition, use):
    """(query, target) for the name that ends the snippets: definition's last character and the character before the
    last of the use, the first occurrences of each snippet (the use's after the definition)."""
    target = code.index(definition) + len(definition) - 1
    return code.index(use, target) + len(use) - 2, target


def test_names_pair_a_definition_with_its_next_use():
    expected = {name_case(NAMES, "def load", "print(load"), name_case(NAMES, "(path", "open(path"),
                name_case(NAMES, "mode", ", mode"), name_case(NAMES, "data", "in data"),
                name_case(NAMES, "for line", "print(line")}
    # os is too short; total is used before its definition; "for each" is in a string; else is a keyword (used
    # twice); value=2 reads as a keyword argument
    assert set(text.name_cases(NAMES)) == expected
    assert all(NAMES[q + 1] == NAMES[t] for q, t in expected)


def test_line_windows_start_at_lines_and_do_not_overlap():
    ids = np.array(([0] + [1] * 6) * 20, dtype=np.uint16)  # a newline (0) every 7 tokens
    windows = text.line_windows(ids, 0, 10, 50)
    assert windows.shape[1] == 10 and 5 <= len(windows) <= 14
    assert (windows[:, 0] == 1).all() and (windows[:, 6] == 0).all()  # each starts right after a newline


class KnownAttention:
    """attention_maps whose layer 0 puts all of each case's query weight on its target; every other row, and all of
    layer 1, is uniform over the visible keys. A window is told apart by its first token, its index."""

    def __init__(self, cases, n_head=3):
        self.targets = {w: (q, t) for w, q, t in cases}
        self.n_head = n_head

    def attention_maps(self, idx):
        B, T = idx.shape
        uniform = torch.ones(T, T).tril()
        uniform = (uniform / uniform.sum(-1, keepdim=True)).expand(B, self.n_head, T, T)
        maps = [uniform.clone(), uniform.clone()]
        for b, w in enumerate(idx[:, 0].tolist()):
            q, t = self.targets[w]
            maps[0][b, :, q] = torch.nn.functional.one_hot(torch.tensor(t), T)
        return maps


def test_measure_reports_all_weight_on_the_target_and_the_baselines_otherwise():
    T = 12
    cases = {"a": [(0, 5, 2), (2, 11, 1), (4, 7, 6)], "b": [(1, 9, 3), (3, 4, 1)]}  # one case a window
    windows = torch.arange(100, 100 + 5 * T).view(5, T)
    windows[:, 0] = torch.arange(5)
    for w, q, t in cases["a"] + cases["b"]:
        windows[w, q - 1 if q - 1 != t else q] = windows[w, t]  # another visible key with the target's token
    values = text.head_weights(KnownAttention(cases["a"] + cases["b"]), windows, cases, batch_size=2)
    for kind, found in cases.items():
        v = values[kind]
        for i, (w, q, t) in enumerate(found):
            uniform = 1 / (q + 1)
            at_distance = np.mean([1 / (k + 1) for k in range(q - t, T) if k != q])  # the other queries' rows
            assert v["target"][i, 0].tolist() == [1.0] * 3 and v["argmax"][i, 0].all()
            assert v["target"][i, 1] == pytest.approx([uniform] * 3) and not v["argmax"][i, 1].any()
            assert v["distance"][i] == pytest.approx(torch.full((2, 3), at_distance))
            assert v["same_token"][i] == pytest.approx(torch.tensor([[0.0] * 3, [uniform] * 3]))
            assert v["previous"][i, 1] == pytest.approx([uniform] * 3)
            assert v["uniform"][i] == pytest.approx(uniform)
    assert text.best_head(values["a"]) == (0, 0)  # layer 0 beats its baseline; its heads tie, the first is taken


def stdlib_run(root):
    """A tiny GPT trained for a few seconds on the stdlib corpus, prepared under root."""
    cfg = Config(model=ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=128),
                 data=DataConfig(dir=str(root / "data")),
                 train=TrainConfig(device="cpu", dtype="float32", batch_size=8, max_iters=20, eval_interval=10,
                                   eval_iters=2, warmup_iters=5, learning_rate=3e-3), out_dir=str(root / "run"))
    train(cfg)
    return Path(cfg.out_dir)


@pytest.mark.slow
def test_exp_text_writes_its_figure_and_rows(tmp_path, monkeypatch, one_thread):
    run = stdlib_run(tmp_path)
    monkeypatch.setitem(text.BUDGET, "quick", 100)
    ctx = Context("quick", torch.device("cpu"), tmp_path / "report", hardware="test")
    ctx.out.mkdir()
    text.exp_text(ctx, run)
    assert (ctx.out / "text_attention.png").stat().st_size > 10_000
    measures = [r["measure"] for r in ctx.rows]
    assert [r["experiment"] for r in ctx.rows] == ["text"] * 3 and measures[0].startswith("bracket:")
    assert measures[1].startswith("name:") and "of 4" in ctx.rows[2]["gpt"]  # 2 layers x 2 heads


def test_exp_text_skips_a_model_of_another_corpus(tiny_run, tmp_path, capsys):
    ctx = Context("quick", torch.device("cpu"), tmp_path, hardware="test", text_run=str(tiny_run))  # --text-run
    text.exp_text(ctx)
    assert ctx.rows == [] and not list(tmp_path.glob("*.png"))
    assert "text: skipped" in capsys.readouterr().out
