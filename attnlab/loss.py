"""A training step's loss without its logits: the head's matmul and the cross-entropy in chunks of rows, one operator
(linear_cross_entropy_chunks), and when a device takes it (chunks_pay). model.py calls it for a large vocabulary."""
import torch

# From this vocabulary on, a CPU training step's loss is computed in chunks of rows: in host memory the fp32
# (B·T, vocab) tensors of the plain path cost more in page faults than the chunks' extra passes
CHUNKED_LOSS_VOCAB = 8192
# On a GPU the plain loss (fused by torch.compile) is several times faster; chunks only from this size of its fp32
# logits on (GPT-2's 16 x 1024 x 50,304 are 3.3 GB): a constant, so that a compiled forward traces no device query
CHUNKED_LOSS_GPU_BYTES = 2 ** 33
# logits per chunk (rows x vocab): on the CPU 8 MB in fp32, small enough for malloc to reuse, not remap; on a GPU
# 512 MB, so that each chunk's matmuls fill the device and the loop stays a few dozen iterations (docs/speed.md)
CHUNK_LOGITS = {"cpu": 2 ** 21, "cuda": 2 ** 27}


def chunks_pay(device, rows, vocab_size):
    """Whether a training step's loss over rows x vocab_size logits on device is computed in chunks of rows."""
    if vocab_size < CHUNKED_LOSS_VOCAB:
        return False
    if device.type == "cpu":
        return True
    if device.type == "cuda":
        return rows * vocab_size * 4 >= CHUNKED_LOSS_GPU_BYTES
    return False  # mps, meta: the plain path


def chunk_rows(device_type, vocab_size):
    """Rows of one chunk of logits on a device of device_type."""
    return max(1, CHUNK_LOGITS.get(device_type, CHUNK_LOGITS["cuda"]) // vocab_size)


def compute_dtype(x):
    """The dtype x's matmuls run in: autocast's where it is on for x's device, else x's own. Passed to the operator
    explicitly, since compiled graphs run with autocast off (AOTAutograd) and would otherwise compute in fp32."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


@torch.library.custom_op("attnlab::linear_cross_entropy_chunks", mutates_args=())
def linear_cross_entropy_chunks(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, dtype: torch.dtype,
                                rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The summed cross-entropy of the logits h @ weightᵀ against targets (-1 ignored), without ever holding all of
    them: each chunk of rows makes its logits, its loss and its gradients, then frees the logits (as Liger-Kernel's
    fused linear cross-entropy). Matmuls in dtype, the softmax and the sums in fp32. Returns (the sum, its gradients
    for h and weight, the count of real targets). An operator of its own, so torch.compile keeps it as one node
    instead of unrolling the loop."""
    # h (N, C), weight (V, C), targets (N,)
    w = weight.to(dtype)  # as autocast casts a linear layer's weight
    loss = torch.zeros((), device=h.device)
    grad_h = torch.empty_like(h)  # (N, C) kept in h's dtype per row: 1/count of it would underflow in fp16
    grad_w = torch.zeros(weight.shape, device=h.device)  # (V, C), fp32 for the sum over chunks
    for start in range(0, h.size(0), rows):
        h_chunk = h[start:start + rows].to(dtype)  # (n, C)
        t_chunk = targets[start:start + rows]  # (n,)
        real = t_chunk != -1  # (n,)
        safe = t_chunk.clamp(min=0)  # (n,) an index for every row; ignored rows are zeroed below
        logits = (h_chunk @ w.T).float()  # (n, V)
        lse = logits.logsumexp(-1)  # (n,)
        loss += ((lse - logits.gather(1, safe[:, None]).squeeze(1)) * real).sum()
        probs = logits.sub_(lse[:, None]).exp_()  # (n, V) softmax, in place of the logits
        probs[torch.arange(probs.size(0), device=h.device), safe] -= 1.0  # d(loss)/d(logits): softmax - onehot
        probs *= real[:, None]  # ignored rows take no gradient
        grad_h[start:start + rows] = probs.to(dtype) @ w  # (n, C)
        grad_w += probs.T.to(dtype) @ h_chunk  # (V, C), each chunk's product in dtype, their sum in fp32
    return loss, grad_h, grad_w, (targets != -1).sum()


@linear_cross_entropy_chunks.register_fake
def _(h, weight, targets, dtype, rows):  # the outputs' shapes, for torch.compile and the meta device
    return h.new_empty(()).float(), torch.empty_like(h), weight.new_empty(weight.shape).float(), targets.new_empty(())


def _save_gradients(ctx, inputs, output):
    _, grad_h, grad_w, _ = output
    ctx.save_for_backward(grad_h, grad_w)
    ctx.weight_dtype = inputs[1].dtype


def _scale_gradients(ctx, grad_loss, *_):
    grad_h, grad_w = ctx.saved_tensors
    return (grad_h.float() * grad_loss).to(grad_h.dtype), (grad_w * grad_loss).to(ctx.weight_dtype), None, None, None


# backward scales the gradients the forward computed by the sum's gradient (1/count, times a GradScaler's scale)
linear_cross_entropy_chunks.register_autograd(_scale_gradients, setup_context=_save_gradients)


def chunked_lm_loss(h, weight, targets, attention_mask=None, dtype=None):
    """The mean cross-entropy over real targets of the logits h @ weightᵀ, h (B, T, C), in chunks of rows sized for
    h's device, matmuls in dtype (default h's): for a large vocabulary's training step."""
    if attention_mask is not None:
        targets = targets.masked_fill(~attention_mask.bool(), -1)
    rows = chunk_rows(h.device.type, weight.size(0))
    loss, _, _, count = linear_cross_entropy_chunks(h.flatten(0, 1), weight, targets.reshape(-1), dtype or h.dtype,
                                                    rows)
    return loss / count.clamp(min=1)
