"""scripts/bench.py runs end to end at tiny sizes (no timing assertions: timings belong to the tables, not to tests)."""
import json
import math

import pytest
import torch
from conftest import words_corpus

import scripts.bench as bench
from scripts.timing import Deadline, hardware_name


def test_quick_bench_prints_every_default_section(capsys):
    bench.main(["--quick"])
    out = capsys.readouterr().out
    machine = hardware_name(torch.device("cpu"))
    assert out.splitlines()[0] == f"## attnlab bench (quick): {machine}, torch {torch.__version__}"
    for title in ("Training throughput", "Sampling", "One causal self-attention layer", "Generation"):
        assert f"### {title}" in out
    assert "### Speedrun" not in out and "### Ablation" not in out  # whole runs only when asked for
    for name in (*bench.PRESETS, "GPT-2 124M"):
        assert f"| {name} |" in out
    assert "n/a" in out  # no MFU on the CPU


@pytest.mark.slow
def test_quick_speedrun_and_ablation_run_every_recipe_and_the_levers_asked_for(tmp_path, monkeypatch, capsys):
    corpus = words_corpus(tmp_path / "corpus.txt", n_words=500)
    monkeypatch.setitem(bench.QUICK, "run", [*bench.QUICK["run"], f"data.dir={tmp_path / 'prepared'}"])
    # two levers beside the full recipe: each row is a whole train.py run, and the --levers test below picks others
    bench.main(["--quick", "--only", "speedrun,ablation", "--data-path", str(corpus), "--levers", "adamw,qk-norm"])
    out = capsys.readouterr().out
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    names = [row[0][2:] for row in rows]
    assert names == ["recipe", *bench.PRESETS, "change", bench.BASE, "AdamW instead of Muon", "no QK-norm"]
    for row in rows:
        if row[0][2:] in bench.PRESETS:  # iterations as each recipe's quick run asked, a finite whole-val loss
            assert row[1] == "2" and 0 < float(row[5]) < 10 and float(row[2]) <= float(row[3])  # trained <= wall
    assert "| nanoGPT CPU recipe | 2 |" in out and "| 100% |" in out  # the reference against itself


def test_a_failing_run_names_the_command(tmp_path, monkeypatch):
    monkeypatch.setitem(bench.QUICK, "run", ["model.n_embd=33"])  # not divisible by n_head
    with pytest.raises(SystemExit, match="failed: .*n_embd"):
        bench.main(["--quick", "--only", "speedrun", "--data-path", str(tmp_path / "corpus.txt")])


@pytest.mark.slow
def test_quick_prepare_times_every_tokenizer_at_1_and_2_workers(capsys):
    bench.main(["--quick", "--only", "prepare"])  # no --bpe-file: GPT-2's tokenizer is left out offline
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [(row[0][2:], row[1]) for row in rows[1:]] == [
        ("char", "1"), ("char", "2"), ("bpe (4096, trained here)", "1"), ("bpe (4096, trained here)", "2")]
    for row in rows[1:]:
        megabytes_per_s, mebibytes, bytes_per_token = (float(row[i].replace(",", "")) for i in (2, 4, 5))
        assert megabytes_per_s > 0 and 0 < mebibytes < 2000 and bytes_per_token >= 1


def test_the_long_recipe_trains_for_the_references_wall_less_the_short_recipes_start_up_and_evaluation():
    runs = {bench.REFERENCE: [(100.0, 2000, 1.9, 95.0)], "speedrun_cpu": [(20.0, 300, 1.88, 14.0)]}
    assert bench.long_recipe_budget(bench.LONG_RECIPE, runs) == ["train.time_budget_s=94.0", "train.max_iters=100000"]
    assert bench.long_recipe_budget("speedrun_cpu", runs) == []


FAKE_NANOGPT = """import sys
assert "--device=cpu" in sys.argv and "--max_iters=2000" in sys.argv and open("data/shakespeare_char/train.bin").read()
for it in range(3):
    print(f"iter {it}: loss 4.0000, time 250.00ms, mfu -100.00%")
print("step 2000: train loss 1.7000, val loss 1.8857")
"""


def test_nanogpts_own_train_py_is_the_reference_once_its_checkout_is_given(tmp_path, monkeypatch, capsys):
    # a stand-in checkout: its prepare.py writes the bins from the text passed, its train.py prints nanoGPT's lines
    data = tmp_path / "nanoGPT" / "data" / "shakespeare_char"
    data.mkdir(parents=True)
    (data / "prepare.py").write_text("open('train.bin', 'w').write(open('input.txt').read())\n")
    (tmp_path / "nanoGPT" / "train.py").write_text(FAKE_NANOGPT)
    (tmp_path / "text.txt").write_text("hello")
    monkeypatch.setattr(bench, "timed_train_py", lambda overrides, seed, args, sizes: (10.0, 300, 1.87, 8.0))
    bench.main(["--quick", "--only", "speedrun", "--nanogpt", str(tmp_path / "nanoGPT"),
                "--data-path", str(tmp_path / "text.txt")])
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| ")][1:]
    assert [row[0][2:] for row in rows] == [bench.NANOGPT, "speedrun_cpu", bench.LONG_RECIPE]
    assert rows[0][1:3] == ["2000", "0.8"] and rows[0][5] == "1.8857"  # its iterations' 3 x 250 ms, its val
    assert rows[0][4] == "100%"  # the reference against itself
    with pytest.raises(SystemExit, match="not a karpathy/nanoGPT checkout"):
        bench.main(["--quick", "--only", "speedrun", "--nanogpt", str(tmp_path)])
    (data / "train.bin").unlink()  # a prepare.py that fails (offline, say) is one line naming the fix
    (data / "prepare.py").write_text("raise OSError('no network')\n")
    with pytest.raises(SystemExit, match="prepare.py in .* failed: OSError: no network; pass --data-path"):
        bench.main(["--quick", "--only", "speedrun", "--nanogpt", str(tmp_path / "nanoGPT")])


def test_levers_picks_the_ablation_rows_by_name_beside_the_full_recipe(tmp_path, monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(bench, "timed_train_py",
                        lambda overrides, seed, args, sizes: ran.append(overrides) or (1, 2, 3, 4))
    bench.main(["--quick", "--only", "ablation", "--levers", "MOMENTUM,evaluation"])
    names = [line.split(" | ")[0][2:] for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert names == ["change", bench.BASE, "Muon momentum 0.95 instead of 0.85",
                     "nanoGPT's evaluation (20 batches every 250 steps)"]
    assert ran[2] == ["experiment=speedrun_cpu", "train.eval_interval=250", "train.eval_iters=20"]


@pytest.mark.slow
def test_vocab_compares_the_chunked_loss_with_the_plain_one(capsys):
    bench.main(["--quick", "--only", "vocab"])
    out = capsys.readouterr().out
    assert "### GPT-2's vocabulary on a small model" in out
    rows = [line for line in out.splitlines() if line.startswith(("| plain loss", "| chunked loss", "| the head's"))]
    assert len(rows) == 3 and all(len(row.split("|")) == 7 for row in rows)


def test_the_gpu_check_smoke_writes_every_figure(tmp_path, capsys):
    out = tmp_path / "gpu_check.json"
    bench.main(["--only", "gpu", "--smoke", "--out", str(out)])
    results = json.loads(out.read_text())
    assert results["hardware"] == hardware_name(torch.device("cpu")) and results["skipped"] == []
    train = results["train"]
    assert train["tokens_per_s"] > 0 and train["peak_step_mib"] > 0 and train["mfu"] is None  # no peak for a CPU
    assert results["sdpa"]["training"] and results["sdpa"]["training"] == results["sdpa"]["eager"]
    assert all(results["sdpa"][case] for case in ("padded", "windowed", "decoding"))
    assert train["vocab_size"] == 50257 and train["graph_breaks"] == 0 and train["peak_flops"] is None
    assert set(results["vocab"]["step_ms"]) == {"50257", "50304"}  # train.py's vocabulary and the padded one
    chunked = results["chunked"]
    assert chunked["chunked_loss"] == pytest.approx(chunked["plain_loss"], abs=1e-3) and chunked["chunk_rows"] == 41
    assert results["syncs"] == {"skipped": "no CUDA device: the sync debug mode needs one"}
    assert len(results["sample"]["rounds_cache"]) == 2  # the warm-up round is reported too
    assert not torch.is_autocast_enabled("cpu")  # the check entered its autocast once at a time
    losses = results["losses"]
    assert losses["steps"] == len(losses["bf16"]) == len(losses["fp32"]) == bench.GPU_SIZES["quick"]["loss_steps"]
    assert all(math.isfinite(v) for v in losses["bf16"] + losses["fp32"]) and losses["fp32"][-1] < losses["fp32"][0]
    assert losses["complete"] and losses["passed"] and 0 <= losses["mean_abs_diff"] <= losses["max_abs_diff"]
    assert results["sample"]["tokens_per_s_cache"] > 0 and results["sample"]["tokens_per_s_recompute"] > 0
    ddp = results["ddp"]
    assert ddp["backend"] == "gloo" and ddp["passed"] and ddp["steps"] == bench.GPU_SIZES["quick"]["ddp_steps"]
    assert not torch.distributed.is_initialized()  # the 1-process group is torn down
    out_text = capsys.readouterr().out
    assert "- losses: PASS" in out_text and "- ddp: PASS" in out_text


def test_the_gpu_check_skips_what_the_deadline_leaves_no_time_for(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(bench.GPU_SIZES["quick"], "part_s", {**bench.GPU_SIZES["quick"]["part_s"], "losses": 10**6})
    out = tmp_path / "gpu_check.json"
    bench.main(["--only", "gpu", "--smoke", "--out", str(out)])
    results = json.loads(out.read_text())
    assert results["skipped"] == ["losses"] and "losses" not in results and "ddp" in results
    assert "- losses: skipped: deadline" in capsys.readouterr().out


def test_the_gpu_check_needs_cuda_unless_smoke(capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here")
    with pytest.raises(SystemExit):
        bench.main(["--only", "gpu"])
    assert "--smoke runs the gpu check on the CPU" in capsys.readouterr().err


def test_a_deadline_fits_what_the_seconds_left_allow():
    now = [100.0]
    deadline = Deadline(60, clock=lambda: now[0])
    assert deadline.fits(60) and not deadline.fits(61)
    now[0] = 150.0
    assert deadline.left() == 10 and not deadline.fits(11)


@pytest.mark.slow
def test_the_gpu_checks_compiled_step_compiles_once(tmp_path, monkeypatch):
    """The CUDA run's path on the CPU: the compiled step is also what the SDPA profile, the bf16 losses and DDP call,
    and a second compilation of GPT-2 would cost a GPU run a minute of its deadline."""
    torch._dynamo.reset()  # other tests' compiled models are not this one's first compilation
    monkeypatch.setitem(bench.GPU_SIZES["quick"], "compile", True)
    out = tmp_path / "gpu_check.json"
    with torch._dynamo.config.patch(error_on_recompile=True):  # dynamo's config refuses monkeypatch's undo
        bench.main(["--only", "gpu", "--smoke", "--out", str(out)])
    results = json.loads(out.read_text())
    assert results["train"]["compile"] and results["losses"]["passed"] and results["ddp"]["passed"]
