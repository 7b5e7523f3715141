"""The parts of a training step that train.py, scripts/report and scripts/bench.py share: the optimizers (AdamW, and
Muon for the hidden matrices), the lr schedule (linear warmup, then cosine), one step.

    optimizer = make_optimizer(model, cfg.train, device)
    set_lr(optimizer, get_lr(it, cfg.train))
    loss = train_step(model, optimizer, [(x, y)], grad_clip=cfg.train.grad_clip)
"""
import math
from contextlib import nullcontext

import torch

from attnlab.config import TrainConfig
from attnlab.runtime import autocast_dtype, native_bf16


def warmup_steps(t: TrainConfig):
    """The warmup's length: warmup_iters, or a tenth of the run where warmup_iters would take all of it (a short run
    of a recipe made for a long one should still decay)."""
    return t.warmup_iters if t.warmup_iters < t.max_iters else t.max_iters // 10


def get_lr(it, t: TrainConfig, seconds=0.0):
    """Linear warmup to learning_rate (warmup_steps), then a cosine decay to min_lr that ends at max_iters, or with a
    time budget at time_budget_s seconds of training, whichever comes first."""
    warmup = warmup_steps(t)
    if it < warmup:
        return t.learning_rate * (it + 1) / warmup
    progress = (it - warmup) / max(1, t.max_iters - warmup)
    if t.time_budget_s > 0:
        progress = max(progress, seconds / t.time_budget_s)
    progress = min(progress, 1.0)
    return t.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (t.learning_rate - t.min_lr)


def set_lr(optimizer, lr):
    """Every group at lr, times its lr_scale (Muon's groups run at muon_lr / learning_rate of the schedule)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)


def make_optimizer(model, t: TrainConfig, device):
    """AdamW with weight decay on matrices only (not on norms, biases or vectors). With optimizer=muon the hidden
    matrices take Muon instead, orthogonalised momentum (Jordan et al. 2024, "Muon: An optimizer for hidden layers"):
    a GPT's blocks' matrices, an RNN's input and recurrent weights (attnlab/rnn.py's rnn.weight_ih_l*, weight_hh_l*);
    embeddings, the head and the gains and biases stay on AdamW, as Muon's authors advise."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]

    def on_muon(name, p):  # a matrix inside a block or a recurrent layer
        return t.optimizer == "muon" and p.dim() == 2 and name.startswith(("transformer.h.", "rnn.weight_"))

    hidden, params = [p for n, p in named if on_muon(n, p)], [p for n, p in named if not on_muon(n, p)]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": t.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    # torch's fused kernel on the CPU too, where it steps faster than foreach (docs/speed.md)
    fused = device.type in ("cpu", "cuda")
    adamw = torch.optim.AdamW(groups, lr=t.learning_rate, betas=(t.beta1, t.beta2), fused=fused)
    if not hidden:
        return adamw
    # bf16 iterations only in a mixed-precision run on a device with native bf16; small models train faster in fp32
    # otherwise, even on a CPU that has it (docs/speed.md)
    mixed = autocast_dtype(device, t.dtype) is not None
    ns_dtype = torch.bfloat16 if mixed and native_bf16(device) else torch.float32
    muon = Muon([{"params": hidden, "lr_scale": t.muon_lr / t.learning_rate}], lr=t.muon_lr, momentum=t.muon_momentum,
                weight_decay=t.weight_decay, ns_dtype=ns_dtype)
    return Optimizers(adamw, muon)


def orthogonalize(update, coefficients, steps, eps, dtype):
    """Newton-Schulz's quintic iterations towards the nearest semi-orthogonal matrix, computed in dtype: about U S' V^T
    with S' in (0.5, 1.5) where U S V^T is the update's SVD; on the short side, so the Gram matrix is the small one."""
    a, b, c = coefficients
    tall = update.size(0) > update.size(1)
    x = update.to(dtype)
    x = x.T if tall else x
    x = x / x.norm().clamp(min=eps)  # spectral norm at most 1
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


class Muon(torch.optim.Optimizer):
    """Muon (Jordan et al. 2024): Nesterov momentum, orthogonalised by Newton-Schulz, and decoupled weight decay.
    torch.optim.Muon's update and state dict at its defaults, with the iterations in ns_dtype: torch's always run in
    bf16, which a CPU without native bf16 computes slowly (docs/speed.md)."""

    def __init__(self, params, lr, momentum, weight_decay, ns_dtype):
        # torch's other options at its defaults, as group keys so that checkpoints read alike: Jordan's quintic (the
        # coefficients that maximise its slope at zero) 5 times; adjust_lr_fn None is its lr * sqrt(max(1, rows / cols))
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=True,
                        ns_coefficients=(3.4445, -4.775, 2.0315), eps=1e-7, ns_steps=5, adjust_lr_fn=None)
        super().__init__(params, defaults)
        self.ns_dtype = ns_dtype

    @torch.no_grad()
    def step(self, closure=None):  # closure: torch.distributed.checkpoint steps with one to create the state
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad)
                buffer = state["momentum_buffer"]
                buffer.lerp_(p.grad, 1 - group["momentum"])
                update = p.grad.lerp(buffer, group["momentum"]) if group["nesterov"] else buffer
                update = orthogonalize(update, group["ns_coefficients"], group["ns_steps"], group["eps"], self.ns_dtype)
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(update, alpha=-group["lr"] * math.sqrt(max(1, p.size(0) / p.size(1))))
        return loss


class Optimizers:
    """Several optimizers that step, zero and checkpoint as one, so the loop and GradScaler see a single one."""

    def __init__(self, *optimizers):
        self.optimizers = optimizers

    @property
    def param_groups(self):  # read afresh: load_state_dict replaces each optimizer's group dicts
        return [g for o in self.optimizers for g in o.param_groups]

    def step(self):
        for o in self.optimizers:
            o.step()

    def zero_grad(self, set_to_none=True):
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        return [o.state_dict() for o in self.optimizers]

    def load_state_dict(self, states):
        for o, state in zip(self.optimizers, states, strict=True):
            o.load_state_dict(state)


def train_step(model, optimizer, batches, grad_clip=0.0, autocast=nullcontext(), scaler=None, all_mean=None):
    """One optimizer step over the micro-batches [(x, y), ...]: their gradients add up to those of the mean loss
    (a DDP model all-reduces them on the last micro-batch only; an FSDP one reduce-scatters them after each, so they
    stay sharded between micro-batches); then, if the loss is finite, clip the gradient norm (of DTensors under FSDP)
    to grad_clip (0: no clipping) and step. all_mean(loss) averages the loss across processes, so every process takes
    the same decision. Returns the loss as a float; after a non-finite one no step is taken and the gradients are
    dropped, and the caller decides whether to go on."""
    scaler = scaler or torch.amp.GradScaler(enabled=False)
    step_loss = torch.zeros((), device=batches[0][0].device)
    for i, (x, y) in enumerate(batches):
        accumulate = i < len(batches) - 1 and hasattr(model, "no_sync")
        with model.no_sync() if accumulate else nullcontext(), autocast:
            loss = model(x, y)[1] / len(batches)
        scaler.scale(loss).backward()
        step_loss += loss.detach()
    if all_mean is not None:
        step_loss = all_mean(step_loss)
    loss_value = step_loss.item()
    if math.isfinite(loss_value):
        if grad_clip > 0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        scaler.step(optimizer)
        scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss_value
