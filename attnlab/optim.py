"""The parts of a training step that train.py, scripts/report and scripts/bench.py share: the optimizers (AdamW, and
Muon for the hidden matrices), the lr schedule (linear warmup, then cosine), one step.

    optimizer = make_optimizer(model, cfg.train, device)
    set_lr(optimizer, get_lr(it, cfg.train))
    loss = train_step(model, optimizer, [(x, y)], grad_clip=cfg.train.grad_clip)
"""
import math
from contextlib import nullcontext
from functools import partial

import torch
import torch.distributed as dist

from attnlab.config import TrainConfig
from attnlab.distributed import is_dtensor, local, map_replicated, map_sharded, torch_optimizers
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
    a GPT's blocks' matrices, an RNN's input and recurrent weights (attnlab/rnn.py's rnn.weight_ih_l*, weight_hh_l*;
    a minGRU's rnn.*.c_z.weight, c_h.weight); embeddings, the head and the gains and biases stay on AdamW, as Muon's
    authors advise."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]

    def on_muon(name, p):  # a matrix inside a block or a recurrent layer
        return t.optimizer == "muon" and p.dim() == 2 and name.startswith(("transformer.h.", "rnn."))

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
    with S' in (0.5, 1.5) where U S V^T is the update's SVD; on the short side, so the Gram matrix is the small one.
    update: a matrix, or a stack of same-shape ones (n, rows, cols), each orthogonalised on its own in one batch."""
    a, b, c = coefficients
    tall = update.size(-2) > update.size(-1)
    x = update.to(dtype).reshape(-1, *update.shape[-2:])  # (n, r, c) with r <= c: one batched matmul per term
    x = x.mT if tall else x
    x = x / x.norm(dim=(1, 2), keepdim=True).clamp(min=eps)  # each one's spectral norm at most 1
    if x.size(-1) >= 2 * x.size(-2) and full_precision(dtype):  # wide, and its matmuls in full precision
        x = gram_iterations(x, coefficients, steps)
    else:
        for _ in range(steps):
            gram = x @ x.mT
            x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    x = x.mT if tall else x
    return x.reshape(update.shape)


def full_precision(dtype):
    """fp64, or fp32 while its matmuls keep fp32's precision: TF32 (train.py's setting on CUDA) rounds nearly as
    coarsely as bf16, in which the Gram matrix drifts."""
    return dtype == torch.float64 or (dtype == torch.float32 and torch.get_float32_matmul_precision() == "highest")


def gram_iterations(x, coefficients, steps):
    """The same iterations on the (r, r) Gram matrix instead of x (r, c): each is x <- p(G) x with p(G) = aI + bG + cG^2
    and G = x x^T, and p(G) commutes with G, so G <- p(G)^2 G and the product of the p(G)s is applied to x once at the
    end: 8r^3 FLOPs an iteration against 4r^2c + 2r^3, less where c >= 2r. Not in bf16, where G drifts from x's."""
    a, b, c = coefficients
    gram = x @ x.mT  # (n, r, r)
    eye = torch.eye(gram.size(-1), dtype=gram.dtype, device=gram.device)
    product = None
    for i in range(steps):
        p = torch.baddbmm(gram, gram, gram, beta=b, alpha=c) + a * eye  # (n, r, r)
        product = p if product is None else p @ product
        if i < steps - 1:
            gram = p @ (p @ gram)
    return product @ x


class Muon(torch.optim.Optimizer):
    """Muon (Jordan et al. 2024): Nesterov momentum, orthogonalised by Newton-Schulz, and decoupled weight decay.
    torch.optim.Muon's update and state dict at its defaults, with the iterations in ns_dtype: torch's always run in
    bf16, which a CPU without native bf16 computes slowly (docs/speed.md).

    The matrices of one shape step together, with one batched Newton-Schulz, rather than some 25 kernels each. In a
    process group each process orthogonalises 1/world_size of them and shares the results (nanochat's DistMuon):
    under DDP every process holds every gradient; under FSDP2 each holds dim-0 shards, gathered whole for its share
    and scattered back, so each shape takes two all-to-alls a step rather than DTensor's dozen collectives a matrix.
    found_inf and grad_scale are GradScaler's contract, honoured as torch's fused AdamW honours them."""

    found_inf = None  # a tensor on the device; 1 skips the step, read there without a host sync
    grad_scale = None  # a tensor the gradients are divided by (the loss scale, when not unscaled already)

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
            params = [p for p in group["params"] if p.grad is not None]
            for shape in dict.fromkeys(p.shape for p in params):  # each shape once, in the group's order
                self.step_matrices(group, [p for p in params if p.shape == shape])
        return loss

    def step_matrices(self, group, params):
        """One step of the group's matrices params, all of one shape; on their local shards under FSDP2."""
        for p in params:
            if "momentum_buffer" not in self.state[p]:
                self.state[p]["momentum_buffer"] = torch.zeros_like(p.grad)
        weights = [local(p) for p in params]
        grads = [local(p.grad) for p in params]
        buffers = [local(self.state[p]["momentum_buffer"]) for p in params]
        if self.grad_scale is not None:
            grads = torch._foreach_div(grads, self.grad_scale)
        skip = None
        if self.found_inf is not None:  # a buffer lerped towards itself stays as it is, and a nan gradient stays out
            skip = self.found_inf.bool()
            grads = [torch.where(skip, b, g) for b, g in zip(buffers, grads)]
        torch._foreach_lerp_(buffers, grads, 1 - group["momentum"])
        updates = torch._foreach_lerp(grads, buffers, group["momentum"]) if group["nesterov"] else buffers
        updates = torch.stack([u.to(self.ns_dtype) for u in updates])  # (n, rows, cols), cast before the copy
        updates = self.orthogonalized(group, params[0], updates).unbind(0)  # add_ promotes each to the weights' dtype
        rows, cols = params[0].shape  # the whole matrix's, under FSDP2 too
        decay, step_size = 1 - group["lr"] * group["weight_decay"], -group["lr"] * math.sqrt(max(1, rows / cols))
        if skip is not None:  # no decay and zero updates: the weights stay as they were, bit for bit
            decay = torch.where(skip, 1.0, decay)
            updates = [torch.where(skip, 0.0, u) for u in updates]
        torch._foreach_mul_(weights, decay)
        torch._foreach_add_(weights, updates, alpha=step_size)

    def orthogonalized(self, group, p, updates):
        """updates (n, rows, cols), the momentum updates of n matrices shaped as p (under FSDP2, this process's
        shards of them), orthogonalised: by this process alone, or 1/world_size of them by each of the group's."""
        newton_schulz = partial(orthogonalize, coefficients=group["ns_coefficients"], steps=group["ns_steps"],
                                eps=group["eps"], dtype=self.ns_dtype)
        if is_dtensor(p):
            return map_sharded(newton_schulz, updates, p.size(0), p.device_mesh.get_group())
        if dist.is_initialized() and dist.get_world_size() > 1:  # DDP's: every process holds the same gradients
            return map_replicated(newton_schulz, updates)
        return newton_schulz(updates)


class Optimizers:
    """Several optimizers that step, zero and checkpoint as one, so the loop and GradScaler see a single one."""

    def __init__(self, *optimizers):
        self.optimizers = optimizers

    def __setattr__(self, name, value):
        if name in ("found_inf", "grad_scale"):  # GradScaler's contract: each optimizer reads them as it steps
            for o in self.optimizers:
                setattr(o, name, value)
        super().__setattr__(name, value)

    def __delattr__(self, name):
        if name in ("found_inf", "grad_scale"):
            for o in self.optimizers:
                delattr(o, name)
        super().__delattr__(name)

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


def train_step(model, optimizer, batches, grad_clip=0.0, autocast=nullcontext(), scaler=None, all_mean=None,
               frozen=None, all_max=None):
    """One optimizer step over the micro-batches [(x, y), ...]: their gradients add up to those of the mean loss (a
    DDP or FSDP model syncs them on the last micro-batch only); then clip the gradient norm (of DTensors under FSDP)
    to grad_clip (0: no clipping) and step, unless the loss is not finite or frozen (a device bool) is True: that
    step is skipped on the device and its gradients dropped. all_mean(loss) averages the loss across processes, so
    every process skips alike; all_max(flag) does the same for fp16's overflow flags (scaled_step). Returns the loss
    as a 0-d tensor on the device: reading it here would make the CPU wait for the device at every step, so the
    caller reads it when it logs."""
    scaler = scaler or torch.amp.GradScaler(enabled=False)
    step_loss = torch.zeros((), device=batches[0][0].device)
    for i, (x, y) in enumerate(batches):
        last = i == len(batches) - 1
        if hasattr(model, "set_requires_gradient_sync"):  # FSDP2: reduce-scatter after the last micro-batch only
            model.set_requires_gradient_sync(last)
        accumulate = not last and hasattr(model, "no_sync")  # DDP: all-reduce after the last micro-batch only
        with model.no_sync() if accumulate else nullcontext(), autocast:
            loss = model(x, y)[1] / len(batches)
        scaler.scale(loss).backward()
        step_loss += loss.detach()
    if all_mean is not None:
        step_loss = all_mean(step_loss)
    skip = ~step_loss.isfinite()
    if frozen is not None:
        skip |= frozen
    if scaler.is_enabled():  # fp16: GradScaler reads its overflow flag on the host at every step anyway
        if not skip.item():
            scaled_step(model, optimizer, scaler, grad_clip, all_max)
    else:
        if grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        step_unless(optimizer, skip)
    optimizer.zero_grad(set_to_none=True)
    return step_loss


def scaled_step(model, optimizer, scaler, grad_clip=0.0, all_max=None):
    """GradScaler's step: unscale, clip, step unless a gradient overflowed, update the scale. Each process finds
    overflows in its own gradients (its shards under FSDP2); all_max makes the flags every process's largest, so all
    skip together: one that skipped alone would leave the others waiting in Muon's all-to-all."""
    scaler.unscale_(optimizer)
    if all_max is not None:
        # the flags GradScaler.step and update read; torch's ShardedGradScaler reduces the same ones
        for found_inf in scaler._per_optimizer_states[id(optimizer)]["found_inf_per_device"].values():
            all_max(found_inf)
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()


def step_unless(optimizer, skip):
    """optimizer.step() unless skip (a device bool): decided on the device by optimizers that take GradScaler's
    found_inf (fused AdamW, Muon), else read on the host."""
    fused = [isinstance(o, Muon) or all(g.get("fused") for g in getattr(o, "param_groups", [{}]))
             for o in torch_optimizers(optimizer)]
    if not all(fused):  # a loaded state can turn fused off: its groups' flags decide
        if not skip.item():
            optimizer.step()
        return
    optimizer.found_inf = skip.float()  # fused AdamW's and Muon's kernels leave parameters and state as they were at 1
    optimizer.step()
    optimizer.found_inf = None
