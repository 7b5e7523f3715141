"""attnlab/optim.py: the lr schedule, one train_step against a hand-written step, gradient accumulation, the skipped
non-finite step, set_lr's lr_scale, which parameters make_optimizer puts on Muon and decays, and Muon against torch's
and against a written-out reference. Tiny GPTs and random matrices, CPU."""
import copy
import math

import pytest
import torch

import attnlab.optim as optim
import attnlab.runtime as runtime
from attnlab.config import TrainConfig
from attnlab.distributed import torch_optimizers
from attnlab.optim import Muon, Optimizers, get_lr, make_optimizer, orthogonalize, set_lr, train_step
from attnlab.rnn import RNN, RNNConfig
from model import GPT, GPTConfig

CPU = torch.device("cpu")
QUINTIC = (3.4445, -4.775, 2.0315)  # torch.optim.Muon's Newton-Schulz coefficients, from Jordan et al.'s post


def tiny_gpt(seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=17, block_size=8, n_layer=2, n_head=2, n_embd=16))


def batch(size, seed=1):
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(17, (size, 9), generator=generator)
    return tokens[:, :-1], tokens[:, 1:]


class NanLoss(torch.nn.Module):
    """A model whose loss is nan, as a corrupted batch or an overflow would make it."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, y):
        logits, loss = self.model(x, y)
        return logits, loss * float("nan")


class GradRecorder:
    """An optimizer that takes no step but keeps the gradients it was asked to step with."""

    def __init__(self, model):
        self.model, self.grads = model, None

    def step(self):
        self.grads = [p.grad.clone() for p in self.model.parameters()]

    def zero_grad(self, set_to_none=True):
        self.model.zero_grad(set_to_none=set_to_none)


def test_lr_schedule_warms_up_then_decays_to_min_lr():
    t = TrainConfig(warmup_iters=10, max_iters=100, learning_rate=1e-3, min_lr=1e-4)
    lrs = [get_lr(it, t) for it in range(101)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    assert lrs[55] == pytest.approx((1e-3 + 1e-4) / 2)  # half way through the cosine
    assert lrs[100] == pytest.approx(1e-4)


def test_a_time_budget_decays_the_lr_over_its_seconds():
    t = TrainConfig(warmup_iters=5, max_iters=10**6, learning_rate=1e-3, min_lr=1e-4, time_budget_s=2.0)
    assert get_lr(10, t, seconds=0.0) > get_lr(10, t, seconds=1.0) > get_lr(10, t, seconds=2.0) == 1e-4
    assert get_lr(10, t, seconds=1.0) == pytest.approx((1e-3 + 1e-4) / 2, rel=1e-4)
    assert get_lr(10, t, seconds=5.0) == 1e-4  # past the budget it stays at min_lr


def test_train_step_equals_a_hand_written_step_bit_for_bit():
    t = TrainConfig(learning_rate=1e-2, grad_clip=0.05)
    model, reference = tiny_gpt(), tiny_gpt()
    optimizer, reference_optimizer = make_optimizer(model, t, CPU), make_optimizer(reference, t, CPU)
    for step in range(3):  # several steps, so AdamW's moments take part too
        x, y = batch(4, seed=step)
        loss = train_step(model, optimizer, [(x, y)], grad_clip=t.grad_clip)

        _, reference_loss = reference(x, y)
        reference_loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), t.grad_clip)
        assert norm > t.grad_clip  # the clip took part
        reference_optimizer.step()
        reference_optimizer.zero_grad(set_to_none=True)

        assert loss == reference_loss.item()
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            assert torch.equal(p, q), (step, name)
            assert p.grad is None, name  # train_step leaves no gradients behind


def test_two_micro_batches_give_the_gradients_of_their_mean():
    model = tiny_gpt()
    x, y = batch(8)
    recorder = GradRecorder(model)
    loss = train_step(model, recorder, [(x[:4], y[:4]), (x[4:], y[4:])])

    _, reference_loss = model(x, y)  # one mean over all 8 sequences
    reference_loss.backward()
    assert loss == pytest.approx(reference_loss.item(), abs=1e-6)
    for grad, p in zip(recorder.grads, model.parameters()):
        assert (grad - p.grad).abs().max() <= 1e-6


@pytest.mark.parametrize("name", ["adamw", "muon"])
def test_a_nonfinite_loss_takes_no_step_and_returns_nan(name):
    model = tiny_gpt()
    optimizer = make_optimizer(model, TrainConfig(optimizer=name), CPU)
    before = copy.deepcopy(model.state_dict())
    loss = train_step(NanLoss(model), optimizer, [batch(4)], grad_clip=1.0)
    assert math.isnan(loss)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # weight decay would move them
    # skipped on the device: a fused AdamW makes its state in the kernel and takes its step count back to 0, and
    # Muon's momentum stays at its zeros: the next step is a first step
    for o in torch_optimizers(optimizer):
        assert all(not s.get("step", 0) and not s.get("momentum_buffer", torch.zeros(1)).any()
                   for s in o.state.values())
    assert all(p.grad is None for p in model.parameters())  # the nan gradients are dropped


def test_a_frozen_run_skips_finite_steps_too_on_the_device():
    model = tiny_gpt()
    optimizer = make_optimizer(model, TrainConfig(optimizer="muon"), CPU)
    before = copy.deepcopy(model.state_dict())
    loss = train_step(model, optimizer, [batch(4)], grad_clip=1.0, frozen=torch.tensor(True))
    assert math.isfinite(loss) and all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    train_step(model, optimizer, [batch(4)], grad_clip=1.0, frozen=torch.tensor(False))
    assert all(not torch.equal(v, before[k]) for k, v in model.state_dict().items() if v.dim() == 2)


def test_set_lr_scales_each_group_by_its_lr_scale():
    t = TrainConfig(optimizer="muon", learning_rate=1e-3, muon_lr=0.02)
    optimizer = make_optimizer(tiny_gpt(), t, CPU)
    set_lr(optimizer, 5e-4)
    adamw, muon = optimizer.optimizers
    assert [g["lr"] for g in adamw.param_groups] == [5e-4, 5e-4]
    assert [g["lr"] for g in muon.param_groups] == [pytest.approx(5e-4 * 0.02 / 1e-3)]  # Muon follows the schedule


def test_make_optimizer_decays_matrices_only_and_puts_block_matrices_on_muon_only_when_asked():
    model = tiny_gpt()
    names = {p: n for n, p in model.named_parameters()}
    block_matrices = {n for p, n in names.items() if p.dim() == 2 and n.startswith("transformer.h.")}
    assert block_matrices and len(block_matrices) < sum(p.dim() == 2 for p in names)  # the embedding is not one

    adamw = make_optimizer(model, TrainConfig(optimizer="adamw", weight_decay=0.1), CPU)
    assert isinstance(adamw, torch.optim.AdamW)
    decayed, not_decayed = adamw.param_groups
    assert decayed["weight_decay"] == 0.1 and not_decayed["weight_decay"] == 0.0
    assert {names[p] for p in decayed["params"]} == {n for p, n in names.items() if p.dim() == 2}
    assert {names[p] for p in not_decayed["params"]} == {n for p, n in names.items() if p.dim() < 2}

    both = make_optimizer(model, TrainConfig(optimizer="muon", weight_decay=0.1), CPU)
    assert isinstance(both, Optimizers)
    adamw, muon = both.optimizers
    assert isinstance(muon, Muon)
    assert {names[p] for g in muon.param_groups for p in g["params"]} == block_matrices
    decayed, not_decayed = adamw.param_groups
    assert {names[p] for p in decayed["params"]} == {n for p, n in names.items() if p.dim() == 2} - block_matrices
    assert {names[p] for p in not_decayed["params"]} == {n for p, n in names.items() if p.dim() < 2}


def muon_steps(optimizer_cls, steps=3, **options):
    """The block matrices of a tiny GPT after a few Muon steps on fixed batches."""
    model = tiny_gpt()
    matrices = [p for n, p in model.named_parameters() if p.dim() == 2 and n.startswith("transformer.h.")]
    optimizer = optimizer_cls(matrices, lr=0.02, momentum=0.9, weight_decay=0.1, **options)
    for step in range(steps):
        x, y = batch(4, seed=step)
        model(x, y)[1].backward()
        optimizer.step()
        optimizer.zero_grad()
    return [p.detach().clone() for p in matrices]


def test_muon_in_bf16_is_torchs_muon_and_in_fp32_within_bf16_rounding():
    reference = muon_steps(torch.optim.Muon)
    start = [p.detach() for n, p in tiny_gpt().named_parameters() if p.dim() == 2 and n.startswith("transformer.h.")]
    for bf16, fp32, torchs, p0 in zip(muon_steps(Muon, ns_dtype=torch.bfloat16),
                                      muon_steps(Muon, ns_dtype=torch.float32), reference, start):
        # a batched bf16 matmul rounds a few sums otherwise than torch's one at a time: observed at most 0.3% of a
        # weight's change (bit-equal for most); fp32 differs by bf16's 8 bits amplified by 5 quintic iterations, 4-12%
        # here; a wrong update is ~100% off
        assert (bf16 - torchs).norm() < 0.02 * (torchs - p0).norm()
        assert not torch.equal(fp32, torchs)  # computed in another dtype
        assert (fp32 - torchs).norm() < 0.2 * (torchs - p0).norm()


def looped_muon_step(muon):
    """The step Muon took before it batched same-shape matrices: one matrix at a time, through 2-d orthogonalize."""
    for group in muon.param_groups:
        for p in group["params"]:
            state = muon.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p.grad)
            buffer = state["momentum_buffer"]
            buffer.lerp_(p.grad, 1 - group["momentum"])
            update = p.grad.lerp(buffer, group["momentum"]) if group["nesterov"] else buffer
            update = orthogonalize(update, group["ns_coefficients"], group["ns_steps"], group["eps"], muon.ns_dtype)
            p.data.mul_(1 - group["lr"] * group["weight_decay"])
            p.data.add_(update, alpha=-group["lr"] * math.sqrt(max(1, p.size(0) / p.size(1))))


def muon_on_matrices(shapes, seed=0):
    """Muon over fresh weights of these shapes in two groups (another lr_scale and weight decay), and the weights."""
    generator = torch.Generator().manual_seed(seed)
    weights = [(0.1 * torch.randn(shape, generator=generator)).requires_grad_() for shape in shapes]
    half = len(weights) // 2
    groups = [{"params": weights[:half], "lr_scale": 2.0}, {"params": weights[half:], "lr_scale": 0.5,
                                                             "weight_decay": 0.3}]
    return Muon(groups, lr=0.02, momentum=0.85, weight_decay=0.1, ns_dtype=torch.float32), weights


# several matrices of each shape, wide, tall and square, in both groups, so each group stacks some
SHAPES = [(16, 64), (64, 16), (16, 64), (32, 32), (96, 8), (32, 32), (64, 16), (16, 64), (32, 32), (8, 96)]


def test_muon_steps_same_shape_matrices_batched_as_it_would_one_at_a_time():
    batched, weights = muon_on_matrices(SHAPES)
    looped, reference = muon_on_matrices(SHAPES)
    generator = torch.Generator().manual_seed(1)
    for step in range(4):
        for w, r in zip(weights, reference):
            w.grad = torch.randn(w.shape, generator=generator)
            r.grad = w.grad.clone()
        batched.step()
        looped_muon_step(looped)
    for w, r in zip(weights, reference):
        assert (w - r).abs().max() < 1e-6  # observed 0 on a CPU; each weight moved 2e-2 at least
        assert (batched.state[w]["momentum_buffer"] - looped.state[r]["momentum_buffer"]).abs().max() < 1e-6
    assert batched.state_dict()["param_groups"] == looped.state_dict()["param_groups"]


def random_grads(weights, seed):
    generator = torch.Generator().manual_seed(seed)
    for w in weights:
        w.grad = torch.randn(w.shape, generator=generator)


class HostSyncs:
    """Counts the calls that read a tensor's value on the host (each a sync with a GPU) while it is entered."""

    def __init__(self, monkeypatch):
        self.count = 0
        for name in ("item", "tolist", "__bool__"):
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self.counted(original))

    def counted(self, original):
        def call(tensor, *args):
            self.count += 1
            return original(tensor, *args)
        return call


@pytest.mark.parametrize("first", [True, False])
def test_muon_skips_a_step_with_found_inf_on_the_device_and_keeps_nan_out(monkeypatch, first):
    muon, weights = muon_on_matrices(SHAPES)
    if not first:  # a momentum to keep
        random_grads(weights, seed=1)
        muon.step()
    before = [w.detach().clone() for w in weights]
    buffers = [muon.state[w]["momentum_buffer"].clone() if not first else torch.zeros_like(w) for w in weights]
    for w in weights:
        w.grad = torch.full_like(w, float("nan"))  # an overflow's gradients
    muon.found_inf = torch.ones(())
    syncs = HostSyncs(monkeypatch)
    muon.step()
    assert syncs.count == 0  # decided on the device
    assert all(torch.equal(w, b) for w, b in zip(weights, before))  # torch.equal: a nan is unequal to everything
    # a skipped first step leaves zero buffers, as good as none: whether to make them is not known on the host
    assert all(torch.equal(muon.state[w]["momentum_buffer"], b) for w, b in zip(weights, buffers))


def test_muon_with_found_inf_zero_or_a_grad_scale_steps_as_without():
    plain, weights = muon_on_matrices(SHAPES)
    flagged, flagged_weights = muon_on_matrices(SHAPES)
    scaled, scaled_weights = muon_on_matrices(SHAPES)
    flagged.found_inf = torch.zeros(())
    scaled.grad_scale = torch.tensor(1024.0)  # GradScaler's scale, a power of 2: unscaling is exact
    for step in range(3):
        for optimizer, ws, factor in [(plain, weights, 1.0), (flagged, flagged_weights, 1.0),
                                      (scaled, scaled_weights, 1024.0)]:
            random_grads(ws, seed=step)
            for w in ws:
                w.grad *= factor
            optimizer.step()
    for w, f, s in zip(weights, flagged_weights, scaled_weights):
        assert torch.equal(w, f) and torch.equal(w, s)
        assert torch.equal(plain.state[w]["momentum_buffer"], scaled.state[s]["momentum_buffer"])


def test_optimizers_hand_found_inf_and_grad_scale_to_each_optimizer():
    model = tiny_gpt()
    optimizer = make_optimizer(model, TrainConfig(optimizer="muon"), CPU)
    found_inf, grad_scale = torch.ones(()), torch.tensor(2.0)
    optimizer.found_inf, optimizer.grad_scale = found_inf, grad_scale
    assert all(o.found_inf is found_inf and o.grad_scale is grad_scale for o in optimizer.optimizers)
    before = copy.deepcopy(model.state_dict())
    model(*batch(4))[1].backward()
    for p in model.parameters():
        p.grad.fill_(float("nan"))
    optimizer.step()  # fused AdamW and Muon both skip it
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    del optimizer.found_inf, optimizer.grad_scale  # as GradScaler does after its step
    assert all(getattr(o, "found_inf", None) is None and getattr(o, "grad_scale", None) is None
               for o in optimizer.optimizers)


def reference_muon(weights, steps, momentum):
    """Muon written out in fp32 as Jordan et al. give it: SGD momentum B <- mu B + g with Nesterov's g + mu B (torch's
    moving average differs by a factor that the normalisation removes), five quintic iterations X <- aX + b(XX^T)X +
    c(XX^T)^2 X (a tall matrix on its right, X <- aX + bX(X^TX) + cX(X^TX)^2), decoupled weight decay and the step
    scaled by sqrt(max(1, rows / cols)). steps: per step, each weight's (gradient, lr, weight decay)."""
    a, b, c = QUINTIC
    weights = [w.clone() for w in weights]
    buffers = [torch.zeros_like(w) for w in weights]
    for step in steps:
        for w, buffer, (grad, lr, weight_decay) in zip(weights, buffers, step):
            buffer.mul_(momentum).add_(grad)
            x = grad + momentum * buffer
            x = x / torch.linalg.matrix_norm(x)
            for _ in range(5):
                if w.shape[0] > w.shape[1]:
                    s = x.T @ x
                    x = a * x + b * (x @ s) + c * (x @ s @ s)
                else:
                    s = x @ x.T
                    x = a * x + b * (s @ x) + c * (s @ s @ x)
            w.mul_(1 - lr * weight_decay)
            w.sub_(lr * math.sqrt(max(1.0, w.shape[0] / w.shape[1])) * x)
    return weights


def test_muon_in_fp32_equals_a_written_out_reference_on_wide_tall_and_square_matrices():
    generator = torch.Generator().manual_seed(0)
    shapes = [(16, 64), (64, 16), (32, 32), (96, 8)]
    start = [0.1 * torch.randn(shape, generator=generator) for shape in shapes]  # weights at a model's scale
    weights = [w.clone().requires_grad_() for w in start]
    groups = [{"params": weights[:2], "lr_scale": 2.0}, {"params": weights[2:], "lr_scale": 0.5, "weight_decay": 0.3}]
    muon = Muon(groups, lr=0.02, momentum=0.85, weight_decay=0.1, ns_dtype=torch.float32)
    steps = []
    for step in range(6):
        set_lr(muon, 0.02 * (1 - step / 6))  # a decaying schedule, each group at its lr_scale
        for w in weights:
            w.grad = torch.randn(w.shape, generator=generator)
        steps.append([(w.grad.clone(), g["lr"], g["weight_decay"]) for g in muon.param_groups for w in g["params"]])
        muon.step()
    for w, expected, w0 in zip(weights, reference_muon(start, steps, momentum=0.85), start):
        # observed 1.2e-7 (fp32's rounding); without Nesterov, lr's sqrt(rows / cols) or an iteration: 1.6e-2 and up
        assert (w - expected).abs().max() < 1e-6
        assert (w - w0).abs().max() > 1e-3  # the steps moved it (observed 1.2e-2 at least)
    assert [sorted(muon.state[w]) for w in weights] == [["momentum_buffer"]] * 4  # torch's name: checkpoints load


def test_muon_state_dict_reads_as_torchs_and_a_closure_step_returns_its_loss():
    w = torch.randn(8, 4, requires_grad=True)
    ours = Muon([{"params": [w], "lr_scale": 1.0}], lr=0.02, momentum=0.85, weight_decay=0.1, ns_dtype=torch.float32)
    torchs = torch.optim.Muon([{"params": [w], "lr_scale": 1.0}], lr=0.02, momentum=0.85, weight_decay=0.1)
    assert ours.state_dict()["param_groups"] == torchs.state_dict()["param_groups"]

    def closure():  # torch.distributed.checkpoint steps with one (FSDP's resume) to create the state
        loss = (w ** 2).sum()
        loss.backward()
        return loss

    before = w.detach().clone()
    loss = ours.step(closure)
    assert loss.requires_grad and loss.item() == (before ** 2).sum().item()  # computed with gradients on, then stepped
    assert list(ours.state[w]) == ["momentum_buffer"] and not torch.equal(w, before)


def test_orthogonalize_brings_singular_values_near_one_for_wide_and_tall_matrices():
    generator = torch.Generator().manual_seed(0)
    for shape in [(8, 32), (32, 8)]:
        update = torch.randn(shape, generator=generator)
        x = orthogonalize(update, QUINTIC, 5, 1e-7, torch.float32)
        assert x.shape == update.shape and x.dtype == torch.float32
        singular = torch.linalg.svdvals(x)
        assert singular.min() > 0.5 and singular.max() < 1.5  # Muon's quintic: about U S' V^T, S' in (0.5, 1.5)


def x_space_quintic(update, steps=5):
    """The iterations on update itself, in its own dtype: the reference for the Gram-space form."""
    a, b, c = QUINTIC
    x = update.mT if update.size(-2) > update.size(-1) else update
    x = x / x.norm(dim=(-2, -1), keepdim=True)
    for _ in range(steps):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.mT if update.size(-2) > update.size(-1) else x


@pytest.mark.parametrize("shape", [(3, 16, 64), (3, 64, 16), (16, 48), (16, 24)])
def test_orthogonalize_in_full_precision_is_the_x_space_iteration_also_on_the_gram_matrix(shape):
    # (16, 24) is under 2:1, so it iterates on x; the others on their Gram matrix (optim.gram_iterations)
    update = torch.randn(shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    reference = x_space_quintic(update)
    assert torch.allclose(orthogonalize(update, QUINTIC, 5, 1e-7, torch.float64), reference, rtol=0, atol=1e-12)
    fp32 = orthogonalize(update.float(), QUINTIC, 5, 1e-7, torch.float32)
    assert (fp32.double() - reference).abs().max() < 1e-5


def test_orthogonalize_in_bf16_or_tf32_iterates_on_the_matrix_itself(monkeypatch):
    monkeypatch.setattr(optim, "gram_iterations", None)  # a call would fail: G drifts from x's in bf16
    update = torch.randn(64, 16, generator=torch.Generator().manual_seed(0))
    x = orthogonalize(update, QUINTIC, 5, 1e-7, torch.bfloat16)
    assert x.dtype == torch.bfloat16 and torch.linalg.svdvals(x.float()).max() < 1.5
    precision, cudnn_tf32 = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    runtime.configure(torch.device("cuda"))  # train.py's switches on a GPU: TF32 matmuls (flags only, no GPU needed)
    try:
        assert not optim.full_precision(torch.float32) and optim.full_precision(torch.float64)
        x = orthogonalize(update, QUINTIC, 5, 1e-7, torch.float32)
    finally:
        torch.set_float32_matmul_precision(precision)
        torch.backends.cudnn.allow_tf32 = cudnn_tf32
    assert torch.linalg.svdvals(x).max() < 1.5


@pytest.mark.parametrize("native, dtype, ns_dtype", [
    (False, "bfloat16", torch.float32), (True, "bfloat16", torch.bfloat16),
    (True, "float32", torch.float32), (False, "float32", torch.float32)])
def test_newton_schulz_runs_in_bf16_only_in_a_bf16_run_where_it_is_native(monkeypatch, native, dtype, ns_dtype):
    monkeypatch.setattr(optim, "native_bf16", lambda device: native)
    _, muon = make_optimizer(tiny_gpt(), TrainConfig(optimizer="muon", dtype=dtype), CPU).optimizers
    assert muon.ns_dtype == ns_dtype


def test_a_warmup_that_would_take_the_whole_run_takes_a_tenth_of_it():
    t = TrainConfig(warmup_iters=100, max_iters=50, learning_rate=1e-3, min_lr=1e-4)
    assert optim.warmup_steps(t) == 5
    assert optim.get_lr(4, t) == pytest.approx(1e-3) and optim.get_lr(49, t) < 2e-4  # warmed up, then decayed
    assert optim.warmup_steps(TrainConfig(warmup_iters=10, max_iters=50)) == 10


@pytest.mark.parametrize("kind, tied", [("lstm", False), ("gru", True)])
def test_muon_takes_an_rnns_input_and_recurrent_matrices_only(kind, tied):
    torch.manual_seed(0)
    model = RNN(RNNConfig(kind, vocab_size=17, block_size=8, n_layer=2, n_embd=16, dropout=0.0, tie_weights=tied))
    adamw, muon = make_optimizer(model, TrainConfig(optimizer="muon"), CPU).optimizers
    on_muon = {n for n, p in model.named_parameters() if any(p is q for g in muon.param_groups for q in g["params"])}
    assert on_muon == {f"rnn.weight_{w}_l{layer}" for w in ("ih", "hh") for layer in (0, 1)}
    on_adamw = {n for n, p in model.named_parameters() if any(p is q for g in adamw.param_groups for q in g["params"])}
    heads = {"wte.weight"} | ({"lm_head.weight"} if not tied else set())  # a tied head is the embedding
    assert on_adamw == heads | {f"rnn.bias_{w}_l{layer}" for w in ("ih", "hh") for layer in (0, 1)}
    assert isinstance(make_optimizer(model, TrainConfig(optimizer="adamw"), CPU), torch.optim.AdamW)


def test_a_tiny_lstm_trains_with_muon_on_its_matrices():
    torch.manual_seed(0)
    model = RNN(RNNConfig("lstm", vocab_size=17, block_size=8, n_layer=1, n_embd=32, dropout=0.0, tie_weights=False))
    t = TrainConfig(optimizer="muon", learning_rate=1e-2, muon_lr=0.02, max_iters=60, warmup_iters=5)
    optimizer = make_optimizer(model, t, CPU)
    x, y = batch(8)  # one fixed batch: the loss must fall as the model memorises it
    matrix = model.rnn.weight_hh_l0.detach().clone()
    losses = []
    for it in range(t.max_iters):
        set_lr(optimizer, get_lr(it, t))
        losses.append(train_step(model, optimizer, [(x, y)], grad_clip=1.0))
    assert losses[-1] < 0.5 * losses[0]  # observed 2.84 -> 1.10 (fixed-batch memorisation)
    assert not torch.equal(matrix, model.rnn.weight_hh_l0)


class SyncRecorder(torch.nn.Module):
    """A model that records what FSDP2's set_requires_gradient_sync was told before each micro-batch."""

    def __init__(self, model):
        super().__init__()
        self.model, self.syncs = model, []

    def set_requires_gradient_sync(self, sync):
        self.syncs.append(sync)

    def forward(self, x, y):
        return self.model(x, y)


def test_an_fsdp_model_reduces_its_gradients_after_the_last_micro_batch_only():
    model = SyncRecorder(tiny_gpt())
    optimizer = make_optimizer(model.model, TrainConfig(), CPU)
    train_step(model, optimizer, [batch(2, seed=k) for k in range(3)])
    assert model.syncs == [False, False, True]
