"""attnlab/rnn.py: GPT's interface, causality, padding, carried state == recomputation, its own config checks, presets
matched to the GPT; minGRU's scan against its sequential steps. Decoding from either model is tested once, in
test_decode.py."""
import io
from dataclasses import replace

import pytest
import torch
from conftest import compose, tiny_config

from attnlab import rnn
from attnlab.checkpoint import build_model
from attnlab.config import ModelConfig, SampleConfig, TrainConfig
from attnlab.decode import generate
from attnlab.optim import make_optimizer
from attnlab.rnn import RNN, RNNConfig, RNNState
from sample import sample
from train import train

TYPES = ["lstm", "gru", "mingru"]


def tiny(type, **kw):
    torch.manual_seed(0)
    cfg = dict(type=type, vocab_size=37, block_size=32, n_layer=2, n_embd=32, dropout=0.0, tie_weights=True)
    return RNN(RNNConfig(**{**cfg, **kw})).eval()


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


@pytest.mark.parametrize("type", ["lstm", "gru"])
@pytest.mark.parametrize("native", [True, False])
def test_bf16_autocast_on_a_cpu_runs_with_or_without_native_bf16(type, native, monkeypatch):
    """Without native bf16 (AVX2) oneDNN cannot build a bf16 LSTM: the recurrence runs in fp32 there instead of
    failing; with it, autocast may take the recurrence to bf16. Either way it trains, padded or not."""
    if native and not rnn.native_bf16(torch.device("cpu")):
        pytest.skip("this CPU has no native bf16")
    monkeypatch.setattr(rnn, "native_bf16", lambda device: native)
    model = tiny(type).train()
    seen = []
    model.rnn.register_forward_hook(lambda module, args, out: seen.append(out[0]))
    x = torch.randint(0, 37, (2, 20))
    mask = torch.arange(20)[None] >= torch.tensor([[0], [5]])  # the second row left-padded by 5
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(x, x)[1] + model(x, x, attention_mask=mask)[1]
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.rnn.parameters())
    if not native:
        assert seen[0].dtype == torch.float32 and seen[1].data.dtype == torch.float32


@pytest.mark.parametrize("type", TYPES)
def test_carried_state_equals_reading_everything_at_once(type):
    model = tiny(type)
    x = torch.randint(0, 37, (2, 24))
    state = RNNState()
    pieces = [model(x[:, :10], cache=state)[0]] + [model(x[:, t:t + 1], cache=state)[0] for t in range(10, 24)]
    torch.testing.assert_close(torch.cat(pieces, dim=1), model(x)[0], atol=1e-5, rtol=0)
    assert state.length == 24


@pytest.mark.parametrize("type, tensors", [("lstm", 2), ("gru", 1), ("mingru", 1)])
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


def test_parameter_counts_and_tying():
    tied, untied = tiny("lstm"), tiny("lstm", tie_weights=False)
    core = 2 * 4 * (2 * 32 * 32 + 2 * 32)  # per layer: 4 gates x (W_ih, W_hh, b_ih, b_hh)
    assert tied.lm_head.weight is tied.wte.weight
    assert tied.num_params() == core + 37 * 32 and tied.num_params(embeddings=False) == core
    assert untied.num_params() == core + 2 * 37 * 32


def test_an_rnn_config_validates_only_the_fields_an_rnn_reads():
    cfg = ModelConfig(type="lstm", n_embd=33, n_head=4)  # 33 is not divisible by 4, which only attention needs
    assert cfg.architecture() == RNNConfig(type="lstm", vocab_size=cfg.vocab_size, block_size=cfg.block_size,
                                           n_layer=cfg.n_layer, n_embd=33, dropout=0.0, tie_weights=cfg.tie_weights)
    with pytest.raises(ValueError, match="n_embd=33 is not divisible by n_head=4"):
        ModelConfig(type="gpt", n_embd=33, n_head=4)


@pytest.mark.parametrize("kw, message", [
    (dict(n_layer=0), "n_layer=0 must be positive"), (dict(dropout=1.0), r"dropout=1.0 must be in \[0, 1\)"),
    (dict(type="gpt"), "type='gpt' is not a recurrent model; use lstm, gru or mingru")])
def test_bad_rnn_configs_name_the_fix(kw, message):
    args = {**dict(type="lstm", vocab_size=37, block_size=16, n_layer=2, n_embd=32, dropout=0.0, tie_weights=True),
            **kw}
    with pytest.raises(ValueError, match=message):
        RNNConfig(**args)


@pytest.mark.parametrize("type", ["gpt", *TYPES])
def test_both_models_report_size_cost_and_context_window(type):
    model = build_model(ModelConfig(type=type, vocab_size=37, block_size=32, n_layer=2, n_head=4, n_embd=32))
    assert model.num_params() > model.num_params(embeddings=False) > 0
    assert model.flops_per_token() >= 6 * model.num_params(embeddings=False) > 0
    assert model.context_window == (32 if type == "gpt" else None)
    if type != "gpt":  # a recurrence costs the same per token however long the context
        assert model.flops_per_token(seq_len=10_000) == model.flops_per_token()


@pytest.mark.parametrize("preset", TYPES)
def test_presets_match_the_default_gpt_within_one_percent(preset):
    cfg = replace(compose(f"model={preset}").model, vocab_size=96)  # the stdlib corpus has 96 characters
    gpt, rnn = build_model(ModelConfig(vocab_size=96)).num_params(), build_model(cfg).num_params()
    print(f"default GPT {gpt:,} parameters, {preset} {rnn:,} ({rnn / gpt - 1:+.2%})")
    assert cfg.type == preset and isinstance(build_model(cfg), RNN) and abs(rnn / gpt - 1) < 0.01


def test_the_rnn_presets_bring_their_tuned_muon_lr_and_the_command_line_still_wins():
    assert compose().train.muon_lr == 0.02 and compose("model=lstm").train.muon_lr == 0.08
    assert compose("model=lstm", "train.muon_lr=0.01").train.muon_lr == 0.01
    assert compose("model=gru").train.muon_lr == 0.02  # the GRU's was not tuned
    assert compose("model=mingru").train.muon_lr == 0.3


@pytest.mark.slow
@pytest.mark.parametrize("type", ["lstm", "mingru"])
def test_train_py_trains_an_rnn_and_sample_py_samples_from_it(tmp_path, type):
    cfg = tiny_config(tmp_path, batch_size=4, max_iters=6, eval_interval=3, warmup_iters=1)
    cfg.model = ModelConfig(type=type, n_layer=1, n_embd=32, block_size=16)
    summary = train(cfg)
    assert summary["iters"] == 6 and (tmp_path / "out" / "best.pt").exists()
    out = io.StringIO()
    common = dict(out_dir=cfg.out_dir, max_new_tokens=30, temperature=0, device="cpu", dtype="float32")
    texts = sample(SampleConfig(prompt="the ", **common), out=out)
    assert texts[0].startswith("the ") and len(texts[0]) == 34 and out.getvalue().startswith("the ")
    padded = sample(SampleConfig(prompts=["the quick ", "a"], **common), out=io.StringIO())  # a left-padded batch
    assert padded == sample(SampleConfig(prompts=["the quick ", "a"], kv_cache=False, **common), out=io.StringIO())
    assert padded[1] == sample(SampleConfig(prompt="a", **common), out=io.StringIO())[0]


@pytest.mark.parametrize("type", ["gpt", *TYPES])
def test_tying_the_head_does_not_change_the_flops(type):
    """The head's matmul runs whether or not its weight is shared with the embedding: counted once either way."""
    flops = {tied: build_model(ModelConfig(type=type, vocab_size=37, block_size=32, n_layer=2, n_head=4, n_embd=32,
                                           tie_weights=tied)).flops_per_token() for tied in (True, False)}
    assert flops[True] == flops[False]


def test_mingru_scan_is_the_recurrence_it_stands_for():
    """parallel_scan_log(log a, log b, h0) against a plain loop h_t = a_t h_{t-1} + b_t, from zeros and from a
    positive h0."""
    torch.manual_seed(0)
    a, b, h0 = torch.rand(2, 30, 5), torch.rand(2, 30, 5), torch.rand(2, 5)
    for start in (None, h0):
        h = torch.zeros(2, 5) if start is None else start
        expected = []
        for t in range(30):
            h = a[:, t] * h + b[:, t]
            expected.append(h)
        torch.testing.assert_close(rnn.parallel_scan_log(a.log(), b.log(), start), torch.stack(expected, dim=1))


@pytest.mark.parametrize("carried", [False, True])
def test_mingru_scan_and_sequential_steps_are_one_model(carried):
    """RNN.scan = False runs the same layers and weights as T sequential steps: the same logits and gradients in fp32,
    from a zero state or from a state carried in the cache."""
    model = tiny("mingru")
    prefix, x = torch.randint(0, 37, (2, 9)), torch.randint(0, 37, (2, 24))
    results = []
    for parallel in (True, False):
        model.scan = parallel
        state = None
        if carried:
            state = RNNState()
            with torch.no_grad():
                model(prefix, cache=state)
            assert state.value.min() > 0  # a nonzero h0 folded into the scan
        model.zero_grad()
        logits, loss = model(x, x, cache=state)
        loss.backward()
        results.append((logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (scan_logits, scan_grads), (step_logits, step_grads) = results
    torch.testing.assert_close(scan_logits, step_logits, atol=1e-5, rtol=0)
    for name, grad in scan_grads.items():
        torch.testing.assert_close(grad, step_grads[name], atol=1e-5, rtol=0, msg=name)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_mingru_under_autocast_keeps_its_scan_in_fp32_over_a_long_sequence(dtype):
    """Under a GPU's autocast the scan sums logs over the whole sequence, so it runs in fp32: proven on the CPU against
    fp64 at T = 2,048. The loss is within 1e-4 (relative) and every gradient finite; a scan left in fp16 or bf16 is
    off by 1e-3 to 1e-2 here."""
    model = tiny("mingru")
    x = torch.randint(0, 37, (2, 2048))
    reference = model.double()(x, x)[1].item()
    model.float().zero_grad()
    with torch.autocast("cpu", dtype=dtype):
        loss = model(x, x)[1]
    loss.backward()
    assert abs(loss.item() - reference) < 1e-4 * reference
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("parallel", [True, False])
def test_mingru_left_padding_never_touches_the_state(parallel):
    model = tiny("mingru")
    model.scan = parallel
    a, b = torch.randint(0, 37, (1, 15)), torch.randint(0, 37, (1, 9))
    batch = torch.cat([a, torch.cat([torch.full((1, 6), 3), b], dim=1)])
    mask = torch.arange(15)[None] >= torch.tensor([[0], [6]])
    state, alone = RNNState(), RNNState()
    torch.testing.assert_close(model(batch, attention_mask=mask, cache=state)[0][1, 6:], model(b, cache=alone)[0][0],
                               atol=1e-5, rtol=0)
    torch.testing.assert_close(state.value[:, 1], alone.value[:, 0], atol=1e-6, rtol=0)
    model.train()  # padding's stand-in logs keep the gradients finite
    model(batch, batch, attention_mask=mask)[1].backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_mingru_generates_the_same_tokens_with_or_without_its_state():
    model = tiny("mingru")
    idx = torch.randint(0, 37, (2, 7))
    mask = torch.arange(7)[None] >= torch.tensor([[0], [3]])
    cached = generate(model, idx, 12, temperature=0, attention_mask=mask)
    assert torch.equal(cached, generate(model, idx, 12, temperature=0, attention_mask=mask, kv_cache=False))


def test_muon_takes_a_mingrus_matrices_and_adamw_the_rest():
    model = tiny("mingru", tie_weights=False)
    adamw, muon = make_optimizer(model, TrainConfig(optimizer="muon"), torch.device("cpu")).optimizers

    def names(optimizer):
        params = [p for group in optimizer.param_groups for p in group["params"]]
        return {n for n, p in model.named_parameters() if any(p is q for q in params)}

    assert names(muon) == {f"rnn.{layer}.c_{w}.weight" for w in "zh" for layer in (0, 1)}
    gains_and_biases = {f"rnn.{layer}.{name}" for name in ("ln.weight", "c_z.bias", "c_h.bias") for layer in (0, 1)}
    assert names(adamw) == {"wte.weight", "lm_head.weight", "ln_f.weight"} | gains_and_biases


@pytest.mark.parametrize("tied", [True, False])
def test_mingru_counts_its_parameters_and_flops(tied):
    model = tiny("mingru", n_layer=3, n_embd=24, tie_weights=tied)
    head, layers = 37 * 24, 3 * (2 * 24 * 24 + 3 * 24)  # a layer: W_z, W_h, their biases, a norm gain
    assert model.num_params() == 37 * 24 * (1 if tied else 2) + layers + 24  # embedding, head, final norm's gain
    assert model.flops_per_token() == 6 * (layers + 24 + head)  # the final norm's gain is the 24
