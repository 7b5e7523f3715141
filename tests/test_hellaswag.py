"""scripts/hellaswag.py: each candidate's summed and mean ending loss equals transformers' GPT-2 on the exported model
(BPE and characters, cropped to the context window alike), acc and acc_norm follow from them, a run and its exported
folder (init_from) score alike, the file is downloaded once, and every bad input is one line; offline."""
import io
import json
import re
import urllib.error
import urllib.request
from dataclasses import asdict

import pytest
import torch

transformers = pytest.importorskip("transformers")

from test_hf import scramble  # noqa: E402

from attnlab.checkpoint import build_model, load_model, save_checkpoint  # noqa: E402
from attnlab.cli import one_line_errors  # noqa: E402
from attnlab.config import HellaSwagConfig, ModelConfig  # noqa: E402
from attnlab.hf import GPT2_ARCH, to_hf  # noqa: E402
from data.tokenizers import CharTokenizer, GPT2Tokenizer, load_tokenizer  # noqa: E402
from scripts.hellaswag import DEFAULT_PATH, PROTOCOL, hellaswag, read_examples, score_examples  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
CPU = torch.device("cpu")
# (ctx, endings): endings of unlike lengths, so the summed and the mean loss can pick different ones; the longer
# candidates exceed the BPE model's window of 64 tokens, and every candidate the char model's 32
EXAMPLES = [
    ("A man is sitting on a roof. he", ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.",
                                        "is holding a rubik's cube.", "starts pulling up roofing on a roof."]),
    ("A woman is outside with a bucket and a dog. The dog is running around trying to avoid a bath. She keeps "
     "calling it back. she", ["rinses the bucket off with soap and blow dry the dog's head.",
                              "uses a hose to keep it from getting soapy.", "gets the dog wet, then it runs away.",
                              "gets into a bath tub with the dog."]),
    ("Two people are playing tennis on a court. they",
     ["hit.", "walk off the court and shake hands with each other.",
      "keep hitting the ball back and forth across the net.", "sit."]),
    ("[header] How to make tea [title] Boil water in a kettle. [step]", ["Pour it over the leaves.", "Eat the kettle.",
                                                                         "Wait.", "Put the tea bag in a cup first."]),
    ("A girl walks up to the balance beam. she", ["jumps onto the beam and does a flip.", "falls.",
                                                  "walks away from the beam and sits down.", "dances."]),
]
TEXT = " " + "".join(ctx + "".join(endings) for ctx, endings in EXAMPLES)


def official(i, ctx, endings, label):
    """A line of hellaswag_val.jsonl, every field of the official format."""
    ctx_a, _, ctx_b = ctx.rpartition(". ")
    return {"ind": 24 + i, "activity_label": "Test", "ctx_a": ctx_a + ".", "ctx_b": ctx_b, "ctx": ctx,
            "split": "val", "split_type": "indomain", "label": label, "endings": list(endings),
            "source_id": f"activitynet~v_test{i}"}


def write_jsonl(path, labels=(0, 1, 2, 3, 0), records=None):
    records = records or [official(i, ctx, endings, label) for i, ((ctx, endings), label)
                          in enumerate(zip(EXAMPLES, labels))]
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def tiny_run(out_dir, tokenizer, block_size, model_type="gpt"):
    """out_dir holding a GPT-2-shaped model (an LSTM for model_type=lstm) far from its init, for tokenizer."""
    shape = GPT2_ARCH if model_type == "gpt" else dict(tie_weights=False)
    model_cfg = ModelConfig(type=model_type, vocab_size=tokenizer.vocab_size, n_layer=2, n_head=2, n_embd=16,
                            block_size=block_size, **shape)
    model = scramble(build_model(model_cfg))
    out_dir.mkdir(parents=True)
    save_checkpoint(out_dir / "ckpt.pt", {"model": model.state_dict(), "model_config": asdict(model_cfg),
                                          "meta": {"name": "text", "tokenizer": tokenizer.spec(),
                                                   "vocab_size": tokenizer.vocab_size}})
    return out_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_bpe):
    """{kind: out_dir}: a run with the tiny GPT-2 BPE (block_size 64) and one with characters (block_size 32)."""
    root = tmp_path_factory.mktemp("hellaswag_runs")
    return {"bpe": tiny_run(root / "bpe", GPT2Tokenizer(tiny_bpe), 64),
            "char": tiny_run(root / "char", CharTokenizer(sorted(set(TEXT))), 32)}


def hf_losses(out_dir, hf_dir, dtype=torch.float32):
    """Each candidate's (summed, mean) ending loss from transformers in dtype: the run exported with its tokenizer,
    the candidate tokenized by the exported tokenizer, cropped to the last n_positions + 1 tokens; and how many were."""
    model, meta = load_model(out_dir)
    to_hf(model, hf_dir, load_tokenizer(meta))
    hf = transformers.GPT2LMHeadModel.from_pretrained(hf_dir).to(dtype).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
    window = hf.config.n_positions
    losses, cropped = [], 0
    for ctx, endings in EXAMPLES:
        row = []
        for ending in endings:
            context, continuation = tokenizer(ctx)["input_ids"], tokenizer(" " + ending)["input_ids"]
            ids = (context + continuation)[-(window + 1):]
            if len(context + continuation) > len(ids):
                cropped += 1
            n = min(len(continuation), len(ids) - 1)
            with torch.no_grad():
                logits = hf(torch.tensor([ids[:-1]])).logits[0]  # (T, vocab)
            nats = -logits.log_softmax(-1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])][-n:]
            row.append((nats.sum().item(), nats.mean().item()))
        losses.append(row)
    return torch.tensor(losses, dtype=torch.float64), cropped  # (examples, 4, 2)


def run(out_dir, **kw):
    """scripts/hellaswag.py's result and printout for HellaSwagConfig(**kw) on the CPU, in batches of 2 examples."""
    cfg = HellaSwagConfig(out_dir=str(out_dir), device="cpu", dtype="float32", batch_size=2, **kw)
    out = io.StringIO()
    return hellaswag(cfg, out=out), out.getvalue()


@pytest.mark.parametrize("kind", ["bpe", "char"])
def test_every_candidate_scores_as_transformers_gpt2_does(kind, runs, tmp_path):
    model, meta = load_model(runs[kind])
    examples = read_examples(write_jsonl(tmp_path / "hellaswag_val.jsonl"))
    # float64 on both sides shows the protocol alone; float32, as the command runs, adds rounding of sums of ~400 nats
    for dtype, rtol in ((torch.float64, 0.0), (torch.float32, 1e-6)):
        theirs, cropped_by_hf = hf_losses(runs[kind], tmp_path / "hf", dtype)
        # batches of 2 examples: rows of unlike widths padded together
        sums, means, cropped = score_examples(model.to(dtype), load_tokenizer(meta), examples, 2, CPU)
        torch.testing.assert_close(sums.double(), theirs[..., 0], atol=1e-4, rtol=rtol)
        torch.testing.assert_close(means.double(), theirs[..., 1], atol=1e-4, rtol=rtol)
        assert cropped == cropped_by_hf > 0
    assert all(len(set(row.tolist())) == 4 for row in sums)  # weights far from init: the candidates differ


def test_acc_and_acc_norm_follow_the_labels(runs, tmp_path):
    theirs, cropped = hf_losses(runs["bpe"], tmp_path / "hf")
    by_sum, by_mean = theirs[..., 0].argmin(1).tolist(), theirs[..., 1].argmin(1).tolist()
    differ = [i for i in range(len(EXAMPLES)) if by_sum[i] != by_mean[i]]
    assert differ, "the fixture should hold an example where the summed and the mean loss disagree"
    # right by the mean only where the two disagree, by neither on another example, by the sum on the other three
    # (where, in this fixture, the mean agrees): acc 3/5, acc_norm 4/5
    labels = list(by_sum)
    labels[differ[0]] = by_mean[differ[0]]
    neither = next(i for i in range(len(EXAMPLES)) if i != differ[0])
    labels[neither] = next(j for j in range(4) if j not in (by_sum[neither], by_mean[neither]))
    expected_acc = sum(label == s for label, s in zip(labels, by_sum)) / len(EXAMPLES)
    expected_norm = sum(label == m for label, m in zip(labels, by_mean)) / len(EXAMPLES)
    assert (expected_acc, expected_norm) == (3 / 5, 4 / 5)
    path = write_jsonl(tmp_path / "hellaswag_val.jsonl", labels)
    result, _ = run(runs["bpe"], data_path=str(path), json=True)
    assert (result["acc"], result["acc_norm"], result["examples"]) == (expected_acc, expected_norm, 5)
    assert result["protocol"] == PROTOCOL and result["candidates_cropped"] == cropped and result["context_window"] == 64
    # the first N examples only
    first, _ = run(runs["bpe"], data_path=str(path), json=True, limit=2)
    assert first["examples"] == 2 and first["acc"] == sum(labels[i] == by_sum[i] for i in range(2)) / 2


def test_published_gpt2_folder_scores_as_the_run_and_the_printout_names_the_protocol(runs, tmp_path, tiny_bpe):
    model, meta = load_model(runs["bpe"])
    to_hf(model, tmp_path / "hf", load_tokenizer(meta))
    path = write_jsonl(tmp_path / "hellaswag_val.jsonl")
    ours, _ = run(runs["bpe"], data_path=str(path))
    gpt2, text = run("unused", init_from=str(tmp_path / "hf"), bpe_file=str(tiny_bpe), data_path=str(path))
    assert (gpt2["acc"], gpt2["acc_norm"]) == (ours["acc"], ours["acc_norm"]) and gpt2["checkpoint"] is None
    numbers = [line for line in text.splitlines() if re.search(r"\d\.\d{4}", line)]
    assert len(numbers) == 2 and all(PROTOCOL in line and "5 examples" in line for line in numbers), text
    assert f"{ours['candidates_cropped']} of 20 candidates were longer than the model's context window of 64" in text


def test_a_char_level_run_and_an_lstm_score(runs, tmp_path):
    path = write_jsonl(tmp_path / "hellaswag_val.jsonl")
    result, _ = run(runs["char"], data_path=str(path))
    assert result["examples"] == 5 and 0 <= result["acc"] <= 1 and result["context_window"] == 32
    lstm = tiny_run(tmp_path / "lstm", CharTokenizer(sorted(set(TEXT))), 32, model_type="lstm")
    result, _ = run(lstm, data_path=str(path))
    assert result["context_window"] is None and result["candidates_cropped"] == 0  # an RNN reads any length


def test_the_file_is_downloaded_once_into_data_hellaswag(runs, tmp_path, monkeypatch):
    contents = write_jsonl(tmp_path / "source.jsonl").read_bytes()
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout: io.BytesIO(contents))
    result, _ = run(runs["bpe"], json=True)
    assert result["data_path"] == str(DEFAULT_PATH) and result["examples"] == 5
    assert DEFAULT_PATH.read_bytes() == contents and sorted(p.name for p in DEFAULT_PATH.parent.iterdir()) == [
        "hellaswag_val.jsonl"]

    def offline(url, timeout):
        raise AssertionError("downloaded twice")
    monkeypatch.setattr(urllib.request, "urlopen", offline)
    assert run(runs["bpe"], json=True)[0]["acc"] == result["acc"]


def one_line_error(capsys, out_dir, **kw):
    """The one line `error: ...` that the command ends with (exit status 2) for HellaSwagConfig(**kw)."""
    cfg = HellaSwagConfig(out_dir=str(out_dir), device="cpu", dtype="float32", **kw)
    with pytest.raises(SystemExit) as exit:
        one_line_errors(hellaswag)(cfg, out=io.StringIO())
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit.value.code == 2 and len(lines) == 1, lines
    return lines[0]


def test_offline_without_the_file_says_where_to_put_it_and_leaves_nothing(runs, tmp_path, monkeypatch, capsys):
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")

    def offline(url, timeout):
        raise urllib.error.URLError("Temporary failure in name resolution")
    monkeypatch.setattr(urllib.request, "urlopen", offline)
    line = one_line_error(capsys, runs["bpe"])
    assert line.startswith("error: could not download HellaSwag from https://raw.githubusercontent.com/rowanz/")
    assert f"put hellaswag_val.jsonl at {DEFAULT_PATH}, or pass data_path=FILE" in line and "name resolution" in line
    assert not any((tmp_path / "cwd").iterdir())
    line = one_line_error(capsys, runs["bpe"], data_path=str(tmp_path / "nowhere.jsonl"))
    assert "data_path=" in line and "does not exist; pass the official hellaswag_val.jsonl" in line


def records_with(change):
    records = [official(i, ctx, endings, 0) for i, (ctx, endings) in enumerate(EXAMPLES)]
    change(records)
    return records


BAD = {  # a change to the fixture: the line it breaks, and what the error says after "FILE line N"
    "missing field": (lambda r: r[1].pop("endings"), 2, " has no 'endings' field; each example needs ctx, endings, "
                                                        "label"),
    "label out of range": (lambda r: r[2].update(label=4), 3, ": label=4 is out of range; it must be 0, 1, 2 or 3"),
    "label not a number": (lambda r: r[0].update(label="2"), 1, ": label='2' is out of range"),
    "three endings": (lambda r: r[3]["endings"].pop(), 4, ": endings must be a list of 4 texts, not of 3 (str, str, "
                                                          "str)"),
    "endings a text": (lambda r: r[0].update(endings="one"), 1, ": endings must be a list of 4 texts, not a str"),
}


@pytest.mark.parametrize("case", BAD)
def test_a_bad_line_is_named_in_one_line(case, runs, tmp_path, capsys):
    change, line_number, message = BAD[case]
    path = write_jsonl(tmp_path / "hellaswag_val.jsonl", records=records_with(change))
    line = one_line_error(capsys, runs["bpe"], data_path=str(path))
    assert line.startswith(f"error: {path} line {line_number}{message}"), line


def test_a_line_that_is_not_json_is_named(runs, tmp_path, capsys):
    path = write_jsonl(tmp_path / "hellaswag_val.jsonl")
    path.write_text(path.read_text() + "{not json\n")
    line = one_line_error(capsys, runs["bpe"], data_path=str(path))
    assert line.startswith(f"error: {path} line 6 is not JSON"), line


def test_a_char_vocabulary_without_the_texts_characters_is_refused(tmp_path, capsys):
    ctx, endings = EXAMPLES[0]
    first = " " + ctx + "".join(endings)
    run_dir = tiny_run(tmp_path / "run", CharTokenizer(sorted(set(first))), 32)  # lacks the second example's capitals
    path = write_jsonl(tmp_path / "hellaswag_val.jsonl")
    line = one_line_error(capsys, run_dir, data_path=str(path))
    second = " " + EXAMPLES[1][0] + "".join(EXAMPLES[1][1])
    missing = ", ".join(repr(c) for c in sorted(set(second) - set(first)))
    assert line == (f"error: {path} line 2 has characters the model's vocabulary lacks: {missing}; HellaSwag needs a "
                    f"tokenizer that covers its text, e.g. a BPE run (data.tokenizer=gpt2 or data.tokenizer=bpe)")


def test_config_values_are_checked():
    with pytest.raises(ValueError, match="limit=0 must be >= 1"):
        HellaSwagConfig(limit=0)
    with pytest.raises(ValueError, match="drop bpe_file or add init_from=gpt2"):
        HellaSwagConfig(bpe_file="gpt2.tiktoken")
