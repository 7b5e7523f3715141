"""scripts/attention.py: the page's data against the model it shows (each head's rows against attention_maps, the losses
against scoring.full_score), the RNN and comparison pages, one line for each bad input, and the page as a person sees
it, in headless Chromium: every head's map drawn, a hover that moves the highlight, no network request."""
import base64
import contextlib
import io
import json
import re
import shutil
import sys
from dataclasses import asdict

import numpy as np
import pytest
import torch
from conftest import CORPUS, compose

import scripts.attention as attention
from attnlab.checkpoint import build_model, load_model, save_checkpoint
from attnlab.cli import quote_free_text, run_cli
from attnlab.config import ModelConfig
from attnlab.scoring import byte_counts, full_score
from data.tokenizers import CharTokenizer

pytestmark = pytest.mark.usefixtures("one_thread")
TOKENIZER = CharTokenizer(sorted(set(CORPUS)))
BLOCK = 16
TEXT = "def f1(x):\n    return x * 1 + 1\n\n" * 3  # 99 characters: 7 windows of BLOCK
GPT = dict(n_layer=2, n_head=3, n_embd=24, block_size=BLOCK)
LSTM = dict(type="lstm", n_layer=1, n_embd=24, block_size=BLOCK)


def saved_run(out_dir, tokenizer=TOKENIZER, **model_kw):
    """out_dir holding an untrained model's checkpoint: all a page needs."""
    torch.manual_seed(0)
    model_cfg = ModelConfig(vocab_size=tokenizer.vocab_size, **model_kw)
    out_dir.mkdir(parents=True)
    save_checkpoint(out_dir / "ckpt.pt", {"model": build_model(model_cfg).state_dict(), "model_config":
                                          asdict(model_cfg), "meta": {"name": "text", "tokenizer": tokenizer.spec()}})
    return str(out_dir)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A GPT's and an LSTM's run folders, same tokenizer."""
    root = tmp_path_factory.mktemp("runs")
    return saved_run(root / "gpt", **GPT), saved_run(root / "lstm", **LSTM)


def page(*overrides):
    """The page `python -m scripts.attention OVERRIDES` writes on the CPU, its data, and what it said on stderr."""
    err = io.StringIO()
    cfg = compose("device=cpu", "dtype=float32", *quote_free_text(list(overrides), "text"), config_name="attention")
    with contextlib.redirect_stdout(io.StringIO()):
        path = attention.attention_page(cfg, err=err)
    data = re.search(r'<script type="application/json" id="data">(.*?)</script>', path.read_text(), re.S)[1]
    return path, json.loads(data), err.getvalue()


def unpacked(text, dtype):
    return np.frombuffer(base64.b64decode(text), dtype)


def cli(*args):
    """`python -m scripts.attention ARGS...` in-process, as its `__main__` block runs it: (status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        patch.setattr(sys, "argv", quote_free_text([attention.__file__, "device=cpu", *args], "text"))
        patch.setenv("HYDRA_FULL_ERROR", "")  # run_cli sets it: unset during the call, as before it afterwards
        patch.delenv("HYDRA_FULL_ERROR")
        try:
            run_cli(attention.main, help_script="-m scripts.attention")
            code = 0
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


def test_each_heads_rows_are_its_largest_attention_weights(runs, tmp_path):
    gpt, _ = runs
    _, data, err = page(f"out_dir={gpt}", f"text={TEXT}", f"page={tmp_path / 'a.html'}")
    a, n = data["attention"], len(TEXT)
    starts, keys, weights = unpacked(a["starts"], "<u4"), unpacked(a["keys"], "<u2"), unpacked(a["weights"], "u1")
    assert data["tokens"] == list(TEXT)
    assert (a["layers"], a["heads"], len(starts)) == (GPT["n_layer"], GPT["n_head"], a["layers"] * a["heads"] * n + 1)
    assert np.array(a["previous"]).shape == np.array(a["induction"]).shape == (a["layers"], a["heads"])
    model, _ = load_model(gpt)
    ids = torch.tensor(TOKENIZER.encode(TEXT))
    for start in range(0, n, BLOCK):
        maps = torch.cat(model.attention_maps(ids[None, start:start + BLOCK]))  # (L, H, T, T)
        for layer, head, q in np.ndindex(maps.shape[:3]):  # each query of each head
            r = (layer * GPT["n_head"] + head) * n + start + q
            row_keys, row_weights = keys[starts[r]:starts[r + 1]], weights[starts[r]:starts[r + 1]] / 255
            assert start <= row_keys.min() and row_keys.max() <= start + q  # causal, inside its window
            assert row_weights[0] == pytest.approx(maps[layer, head, q].max().item(), abs=0.5 / 255 + 1e-6)
            assert list(row_weights) == sorted(row_weights, reverse=True)
    assert "7 windows of its block_size=16" in err


def test_the_losses_are_the_scores_scripts_evaluate_gives(runs, tmp_path):
    gpt, lstm = runs
    _, data, _ = page(f"out_dir={gpt}", f"text={TEXT}", f"compare={lstm}", f"page={tmp_path / 'a.html'}")
    ids = np.array(TOKENIZER.encode(TEXT))
    counts = byte_counts(TOKENIZER, torch.device("cpu"))
    for run, shown in zip(runs, data["models"]):
        losses = shown["losses"]
        assert losses[0] is None and len(losses) == len(TEXT)
        scored = full_score(load_model(run)[0], ids, 4, BLOCK, counts)
        assert np.mean(losses[1:]) == pytest.approx(scored.loss, abs=1e-3)  # 3 decimals a token
    assert [m["kind"] for m in data["models"]] == ["gpt", "lstm"]
    assert data["attention"]["out_dir"] == gpt


def test_an_rnn_alone_gets_the_loss_view_and_a_sentence_on_why_it_has_no_attention(runs, tmp_path):
    _, lstm = runs
    _, data, _ = page(f"out_dir={lstm}", f"text={TEXT}", f"page={tmp_path / 'a.html'}")
    assert data["attention"] is None and len(data["models"][0]["losses"]) == len(TEXT)
    assert f"{lstm} is an LSTM" in data["no_attention"] and "no attention to show" in data["no_attention"]


def test_a_long_text_is_cut_and_the_page_and_stderr_say_so(runs, tmp_path):
    gpt, _ = runs
    _, data, err = page(f"out_dir={gpt}", f"text={TEXT}", "max_tokens=40", f"page={tmp_path / 'a.html'}")
    assert len(data["tokens"]) == 40
    assert data["notes"] == err.splitlines()
    assert err.splitlines()[0] == "the text's 99 tokens are cut to its first 40 (max_tokens)"


def test_the_command_line_takes_free_text_and_writes_the_page_where_asked(runs, tmp_path):
    gpt, _ = runs
    text = "print('a, b', [1, 2]) # ${x} \\"  # what Hydra's grammar would refuse or resolve, unquoted
    code, out, _ = cli(f"out_dir={gpt}", f"text={text}", f"page={tmp_path / 'p.html'}")
    assert code == 0 and out.startswith(f"wrote {tmp_path / 'p.html'}")
    data = re.search(r'id="data">(.*?)</script>', (tmp_path / "p.html").read_text(), re.S)[1]
    assert "".join(json.loads(data)["tokens"]) == text


@pytest.mark.parametrize("args, message", [
    (["out_dir={tmp}/none", "text=abc"], "no checkpoint in {tmp}/none; train one with: python train.py"),
    (["out_dir={gpt}", "compare={tmp}/none", "text=abc"], "no checkpoint in {tmp}/none"),
    (["out_dir={gpt}", "text="], "text is empty; pass the text to read"),
    (["out_dir={gpt}", "text=a"], "text holds 1 token(s) but the page needs 2 or more"),
    (["out_dir={gpt}"], 'no text to read; pass text="..." or text_file=FILE'),
    (["out_dir={gpt}", "text=abc", "text_file={tmp}/t.txt"], 'pass text="..." or text_file=FILE, not both'),
    (["out_dir={gpt}", "text_file={tmp}/none.txt"], "text_file={tmp}/none.txt does not exist"),
    (["out_dir={gpt}", "text=caf\u00e9 \u2713"], "text has characters the model's vocabulary lacks: '\u00e9', "
                                                 "'\u2713'"),
    (["out_dir={gpt}", "text=abc", "compare={other}"], f"({TOKENIZER.vocab_size} characters) and compare={{other}} "
                                                       f"(5 characters) cut text into different tokens"),
])
def test_bad_input_gets_one_line(runs, tmp_path, args, message):
    gpt, _ = runs
    other = saved_run(tmp_path / "other", CharTokenizer("abc \n"), **GPT)
    (tmp_path / "t.txt").write_text("abc")
    fill = dict(tmp=tmp_path, gpt=gpt, other=other)
    code, _, err = cli(*(a.format(**fill) for a in args))
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1
    assert message.format(**fill) in err


# ----- in a browser

@pytest.fixture(scope="module")
def browser():
    """Headless Chromium driven by selenium, with the system's chromedriver (nothing downloaded)."""
    chromium, driver = shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver")
    if not (chromium and driver):
        pytest.skip("no headless browser here: apt-get install chromium chromium-driver (as .ci/run does)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is a dev dependency: pip install -e .[dev]")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    chrome = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver))
    yield chrome
    chrome.quit()


def opened(browser, path):
    """Open path; the page must have run without an error and loaded nothing beside itself."""
    browser.get(path.as_uri())
    assert [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
    assert browser.execute_script("return document.querySelectorAll('[src], [href]').length") == 0
    policy = browser.execute_script("return document.querySelector('meta[http-equiv=Content-Security-Policy]').content")
    assert policy.startswith("default-src 'none';")  # nothing could be fetched even if a script tried


DRAWN = """return [...document.querySelectorAll('#heads canvas')].map(c => {
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let inked = 0;
  for (let i = 0; i < d.length; i += 4) if (d[i] < 250) inked++;
  return inked;
});"""
HIGHLIGHT = "return [...document.querySelectorAll('#text .tok')].map(s => s.style.background)"
COLOURED = "return [...document.querySelectorAll('#text .tok')].filter(s => s.style.background).length"


def test_the_page_draws_every_head_and_a_hover_moves_the_highlight(browser, runs, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    gpt, lstm = runs
    path, data, _ = page(f"out_dir={gpt}", f"text={TEXT}", f"compare={lstm}", f"page={tmp_path / 'a.html'}")
    opened(browser, path)
    inked = browser.execute_script(DRAWN)
    assert len(inked) == GPT["n_layer"] * GPT["n_head"] and min(inked) > 0
    shown = browser.execute_script("return document.getElementById('text').textContent")
    assert shown.replace("\u21b5", "") == TEXT == "".join(data["tokens"])  # a newline is shown as \u21b5 too
    assert browser.find_element(By.CSS_SELECTOR, "input[value=diff]").is_selected()  # a comparison shows it first
    assert browser.execute_script(COLOURED) == len(TEXT) - 1  # every token but the first, which has no loss
    browser.find_element(By.CSS_SELECTOR, "input[value=attention]").click()
    tokens = browser.find_elements(By.CSS_SELECTOR, "#text .tok")
    seen = []
    for i in (4, 13):
        ActionChains(browser).move_to_element(tokens[i]).perform()
        assert browser.execute_script("return document.body.dataset.query") == str(i)
        seen.append((browser.execute_script(HIGHLIGHT), browser.execute_script(
            "return [...document.querySelectorAll('#heads canvas')].map(c => c.toDataURL())")))
    (text_a, maps_a), (text_b, maps_b) = seen
    assert text_a != text_b  # the selected head's weights from token 13, not from token 4
    assert all(a != b for a, b in zip(maps_a, maps_b))  # every map marks the new token's row


def test_an_rnn_page_shows_its_losses_and_no_maps(browser, runs, tmp_path):
    from selenium.webdriver.common.by import By

    _, lstm = runs
    path, data, _ = page(f"out_dir={lstm}", f"text={TEXT}", f"page={tmp_path / 'a.html'}")
    opened(browser, path)
    assert browser.find_elements(By.CSS_SELECTOR, "#heads canvas") == []
    assert "no attention to show" in browser.find_element(By.ID, "about").text
    assert browser.execute_script(COLOURED) == len(TEXT) - 1  # by loss: every token but the first
