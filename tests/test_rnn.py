"""rnn.py: GPT's interface, causality, padding, carried state == recomputation, presets matched to the GPT."""
import io
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from config import ModelConfig
from model import GPT
from rnn import RNN, RNNState

TYPES = ["lstm", "gru"]
PRESETS = Path(__file__).parent.parent / "configs" / "model"


def tiny(type, **kw):
    torch.manual_seed(0)
    return RNN(ModelConfig(type=type, vocab_size=37, block_size=32, n_layer=2, n_embd=32, **kw)).eval()


@pytest.mark.parametrize("type", TYPES)
def test_forward_shapes_loss_and_causality(type):
    model = tiny(type)
    x = torch.randint(0, 37, (2, 20))
    logits, loss = model(x, x)
    assert logits.shape == (2, 20, 37) and abs(loss.item() - torch.log(torch.tensor(37.0)).item()) < 0.1
    changed = x.clone()
    changed[:, 11:] = (changed[:, 11:] + 5) % 37
    torch.testing.assert_close(model(changed)[0][:, :11], logits[:, :11], atol=1e-6, rtol=0)
    assert model(x)[1] is None


@pytest.mark.parametrize("type", TYPES)
def test_carried_state_equals_reading_everything_at_once(type):
    model = tiny(type)
    x = torch.randint(0, 37, (2, 24))
    state = RNNState()
    pieces = [model(x[:, :10], cache=state)[0]] + [model(x[:, t:t + 1], cache=state)[0] for t in range(10, 24)]
    torch.testing.assert_close(torch.cat(pieces, dim=1), model(x)[0], atol=1e-5, rtol=0)
    assert state.length == 24


@pytest.mark.parametrize("type, tensors", [("lstm", 2), ("gru", 1)])
def test_state_size_does_not_grow_with_context(type, tensors):
    model, state = tiny(type), RNNState()
    sizes = []
    for _ in range(3):
        model(torch.randint(0, 37, (3, 50)), cache=state)
        sizes.append(state.nbytes)
    assert sizes == [tensors * 2 * 3 * 32 * 4] * 3  # (h, c) or h, each n_layer x B x n_embd float32


@pytest.mark.parametrize("type", TYPES)
def test_left_padding_gives_each_sequence_its_own_logits_and_loss(type):
    model = tiny(type)
    a, b = torch.randint(0, 37, (1, 15)), torch.randint(0, 37, (1, 9))
    batch = torch.cat([a, torch.cat([torch.full((1, 6), 3), b], dim=1)])
    mask = torch.ones(2, 15, dtype=torch.bool)
    mask[1, :6] = False
    logits = model(batch, attention_mask=mask)[0]
    torch.testing.assert_close(logits[0], model(a)[0][0], atol=1e-5, rtol=0)
    torch.testing.assert_close(logits[1, 6:], model(b)[0][0], atol=1e-5, rtol=0)
    targets = torch.randint(0, 37, (1, 9))
    padded_loss = model(batch[1:], torch.cat([torch.full((1, 6), 5), targets], dim=1), attention_mask=mask[1:])[1]
    torch.testing.assert_close(padded_loss, model(b, targets)[1], atol=1e-5, rtol=0)


def test_bad_padding_is_a_clear_error():
    model = tiny("lstm")
    x = torch.randint(0, 37, (2, 6))
    with pytest.raises(ValueError, match="left padding"):
        model(x, attention_mask=torch.tensor([[1, 1, 0, 1, 1, 1], [1] * 6]).bool())
    with pytest.raises(ValueError, match="without real tokens"):
        model(x, attention_mask=torch.tensor([[0] * 6, [1] * 6]).bool())


@pytest.mark.parametrize("type", TYPES)
def test_greedy_generation_same_with_and_without_carried_state(type):
    model = tiny(type)
    prompt = torch.randint(0, 37, (2, 5))
    mask = torch.tensor([[True] * 5, [False, False, True, True, True]])
    # past block_size (an RNN has no limit); fewer steps when padded: on CPU each new length builds a oneDNN kernel
    for new, kw in ((30, {}), (8, {"attention_mask": mask})):
        with_state = model.generate(prompt, new, temperature=0, **kw)
        assert torch.equal(with_state, model.generate(prompt, new, temperature=0, kv_cache=False, **kw))
        assert with_state.shape == (2, 5 + new)
    alone = model.generate(prompt[1:, 2:], 10, temperature=0)
    assert torch.equal(model.generate(prompt, 10, temperature=0, attention_mask=mask)[1, 2:], alone[0])


def test_generation_is_seeded_and_stops_at_stop_tokens():
    model = tiny("gru")
    prompt = torch.randint(0, 37, (3, 4))
    a = model.generate(prompt, 20, top_k=5, top_p=0.9, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, model.generate(prompt, 20, top_k=5, top_p=0.9, generator=torch.Generator().manual_seed(1)))
    assert model.generate(prompt, 200, stop_tokens=range(37)).shape == (3, 5)
    with pytest.raises(ValueError, match="temperature"):
        model.generate(prompt, 3, temperature=-1)


def test_parameter_counts_and_tying():
    tied, untied = tiny("lstm"), tiny("lstm", tie_weights=False)
    core = 2 * 4 * (2 * 32 * 32 + 2 * 32)  # per layer: 4 gates x (W_ih, W_hh, b_ih, b_hh)
    assert tied.lm_head.weight is tied.wte.weight
    assert tied.num_params() == core + 37 * 32 and tied.num_params(embeddings=False) == core
    assert untied.num_params() == core + 2 * 37 * 32
    with pytest.raises(ValueError, match="rnn"):
        RNN(ModelConfig(type="rnn"))


@pytest.mark.parametrize("preset", ["lstm", "gru"])
def test_presets_match_the_default_gpt_within_one_percent(preset):
    cfg = ModelConfig(**{**OmegaConf.to_container(OmegaConf.load(PRESETS / f"{preset}.yaml")), "vocab_size": 96})
    gpt, rnn = GPT(ModelConfig(vocab_size=96)).num_params(), RNN(cfg).num_params()
    print(f"default GPT {gpt:,} parameters, {preset} {rnn:,} ({rnn / gpt - 1:+.2%})")
    assert cfg.type == preset and abs(rnn / gpt - 1) < 0.01


@pytest.mark.slow
def test_train_py_trains_an_lstm_and_sample_py_samples_from_it(tmp_path):
    from config import Config, DataConfig, SampleConfig, TrainConfig
    from sample import sample
    from train import train
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog\n" * 60)
    cfg = Config(model=ModelConfig(type="lstm", n_layer=1, n_embd=32, block_size=16),
                 data=DataConfig(name="text", path=str(corpus), dir=str(tmp_path / "prepared")),
                 train=TrainConfig(device="cpu", batch_size=4, max_iters=6, eval_interval=3, eval_iters=2,
                                   warmup_iters=1), out_dir=str(tmp_path / "run"))
    summary = train(cfg)
    assert summary["iters"] == 6 and (tmp_path / "run" / "best.pt").exists()
    out = io.StringIO()
    common = dict(out_dir=str(tmp_path / "run"), max_new_tokens=30, temperature=0, device="cpu")
    texts = sample(SampleConfig(prompt="the ", **common), out=out)
    assert texts[0].startswith("the ") and len(texts[0]) == 34 and out.getvalue().startswith("the ")
    padded = sample(SampleConfig(prompts=["the quick ", "a"], **common), out=io.StringIO())  # a left-padded batch
    assert padded == sample(SampleConfig(prompts=["the quick ", "a"], kv_cache=False, **common), out=io.StringIO())
    assert padded[1] == sample(SampleConfig(prompt="a", **common), out=io.StringIO())[0]
