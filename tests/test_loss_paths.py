"""Which loss a training step takes on each device, and what it costs where a GPU would see it: the plain loss on a
GPU (fused by torch.compile into a small graph), chunks on the CPU; fp16 gradients through either as accurate as
the plain loss's. Shapes on the meta device, precision under fp16 autocast on the CPU."""
import pytest
import torch

from attnlab import loss as loss_module
from attnlab.checkpoint import build_model
from attnlab.config import ModelConfig
from attnlab.loss import CHUNKED_LOSS_VOCAB, chunks_pay
from attnlab.scoring import EVAL_LOGITS, Tally, score_batch
from model import GPT, GPTConfig

GPT2 = dict(vocab_size=50304, block_size=1024, n_layer=12, n_head=12, n_embd=768)
ROWS = 16 * 1024  # GPT-2's micro-batch: 16 sequences of 1,024 tokens


def test_the_cpu_chunks_a_large_vocabulary_only():
    cpu = torch.device("cpu")
    assert chunks_pay(cpu, ROWS, CHUNKED_LOSS_VOCAB) and chunks_pay(cpu, 1, 50304)
    assert not chunks_pay(cpu, ROWS, CHUNKED_LOSS_VOCAB - 1) and not chunks_pay(cpu, ROWS, 65)


def test_a_gpu_takes_the_plain_loss_unless_its_fp32_logits_reach_8_gib():
    cuda = torch.device("cuda", 0)
    assert not chunks_pay(cuda, ROWS, 50304) and not chunks_pay(cuda, 2 * ROWS, 50304)  # 3.3 and 6.6 GB
    assert chunks_pay(cuda, 4 * ROWS, 50304)  # 13 GB
    assert not chunks_pay(torch.device("meta"), 4 * ROWS, 50304) and not chunks_pay(torch.device("mps"), ROWS, 50304)


def test_a_chunk_is_sized_for_its_device():
    """The CPU's 2^21 logits (41 rows of GPT-2's vocabulary) on a GPU would be about 1,200 Python iterations a
    micro-step at batch 64, each re-reading the head: a GPU takes chunks of 2^27 logits."""
    assert loss_module.chunk_rows("cpu", 50304) == 41 and loss_module.chunk_rows("cuda", 50304) == 2668
    assert -(-64 * 1024 // loss_module.chunk_rows("cuda", 50304)) == 25  # chunks a micro-step at batch 64
    assert loss_module.chunk_rows("cpu", 10 ** 9) == 1


def test_a_gpu_scores_whole_rows_and_only_the_cpu_splits_a_row_into_tokens():
    """GPT-2's vocabulary at T = 1,024: the CPU's pieces are 1 row x 20 tokens (about 2,000 forwards a batch of 64,
    through the cache, which a compiled model would recompile on); a GPU's are whole rows."""
    from attnlab.scoring import eval_pieces
    assert eval_pieces("cpu", 1024, 50304) == (1, 20)
    assert eval_pieces("cuda", 1024, 50304) == (1, 1024)
    assert eval_pieces("cuda", 128, 50304) == (10, 128)


def training_graph(model, x, y):
    """torch._dynamo.explain of a training forward: (graphs, the reasons it broke them, FX nodes in all graphs)."""
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(x, y)
    reasons = [r.reason for r in explained.break_reasons]
    return explained.graph_count, reasons, sum(len(g.graph.nodes) for g in explained.graphs)


@pytest.mark.slow  # dynamo traces GPT-2's 12 blocks: a few seconds
def test_gpt2s_compiled_training_graph_on_a_gpu_is_one_small_graph():
    with torch.device("meta"):  # shapes only, as a GPU would trace them: the plain loss
        model = GPT(GPTConfig(**GPT2))
        x = torch.randint(0, GPT2["vocab_size"], (16, 1024))
    graphs, breaks, nodes = training_graph(model, x, x)
    assert graphs == 1 and not breaks and nodes < 1000  # the chunk loop unrolled made over 13,000


def test_the_chunked_loss_is_one_node_of_the_compiled_graph():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50304, block_size=64, n_layer=2, n_head=2, n_embd=64))
    x = torch.randint(0, 50304, (8, 64))  # 512 rows, 13 chunks
    graphs, breaks, nodes = training_graph(model, x, x)
    assert graphs == 1 and not breaks and nodes < 200  # the chunk loop stays inside its operator


def fp16_gradient_error(model, reference, x, y):
    """The relative error of the model's gradients under fp16 autocast with the loss scaled by 2^16, as GradScaler
    scales it, against the same model's in fp64."""
    scale = 2.0 ** 16
    with torch.autocast("cpu", dtype=torch.float16):
        loss = model(x, y)[1]
    grads = [g / scale for g in torch.autograd.grad(loss * scale, list(model.parameters()))]
    exact = torch.autograd.grad(reference(x, y)[1], list(reference.parameters()))
    flat = torch.cat([g.flatten() for g in grads])
    flat_exact = torch.cat([g.flatten().float() for g in exact])
    return ((flat - flat_exact).norm() / flat_exact.norm()).item()


@pytest.mark.slow  # 8,192 rows of an 8,192-token vocabulary, in fp16 and fp64: about 10 s
def test_fp16_gradients_through_the_chunked_loss_are_as_accurate_as_the_plain_ones(monkeypatch, one_thread):
    # LayerNorm: RMSNorm computes in fp32, which would cap the fp64 reference's precision
    config = GPTConfig(vocab_size=8192, block_size=128, n_layer=2, n_head=2, n_embd=64, norm="layernorm",
                       qk_norm=False)
    torch.manual_seed(0)
    model = GPT(config)
    reference = GPT(config).double()
    reference.load_state_dict(model.state_dict())
    x = torch.randint(0, config.vocab_size, (64, 128))
    y = torch.randint(0, config.vocab_size, (64, 128))
    chunked = fp16_gradient_error(model, reference, x, y)  # the CPU's path for this vocabulary
    monkeypatch.setattr(loss_module, "CHUNKED_LOSS_VOCAB", 10 ** 9)  # the plain path, for reference
    plain = fp16_gradient_error(model, reference, x, y)
    assert plain < 5e-3 and chunked <= 2 * plain, (chunked, plain)


@pytest.mark.parametrize("kind", ["gpt", "lstm"])
@pytest.mark.parametrize("block_size", [64, 512])  # 2 rows a piece; a row in 4 pieces through the cache
def test_evaluation_scores_a_large_vocabulary_in_small_pieces_to_the_same_figures(kind, block_size):
    torch.manual_seed(0)
    config = ModelConfig(type=kind, vocab_size=CHUNKED_LOSS_VOCAB, block_size=block_size, n_layer=1, n_head=2,
                         n_embd=16)
    model = build_model(config).eval()
    x, y = torch.randint(0, CHUNKED_LOSS_VOCAB, (2, 6, block_size))
    counts = torch.randint(0, 3, (CHUNKED_LOSS_VOCAB,))
    pieces = []
    model.register_forward_hook(lambda module, args, out: pieces.append(tuple(args[0].shape)))
    split, whole = Tally(counts), Tally(counts)
    with torch.no_grad():
        loss = score_batch(model, x, y, split)
        logits, reference = model(x, y)
    whole.add(logits, y, reference)
    assert max(b * t for b, t in pieces[:-1]) * CHUNKED_LOSS_VOCAB <= EVAL_LOGITS["cpu"]  # the reference's call is last
    assert len(pieces) > 2
    assert loss.item() == pytest.approx(reference.item(), abs=1e-5)
    assert split.loss == pytest.approx(whole.loss, abs=1e-5)
    assert split.bits_per_byte == pytest.approx(whole.bits_per_byte, abs=1e-5)


def test_the_chunked_operator_trains_through_aot_autograd_to_the_eager_gradients():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=CHUNKED_LOSS_VOCAB, block_size=32, n_layer=1, n_head=2, n_embd=16))
    x = torch.randint(0, CHUNKED_LOSS_VOCAB, (4, 32))
    eager = torch.autograd.grad(model(x, x)[1], list(model.parameters()))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)  # the graph inductor would receive
    traced = torch.autograd.grad(compiled(x, x)[1], list(model.parameters()))
    assert all(torch.allclose(a, b, atol=1e-6, rtol=0) for a, b in zip(eager, traced))


def test_evaluation_in_pieces_under_bf16_autocast_keeps_its_cache_in_bf16_and_scores_alike():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=CHUNKED_LOSS_VOCAB, block_size=512, n_layer=1, n_head=2, n_embd=16)).eval()
    x, y = torch.randint(0, CHUNKED_LOSS_VOCAB, (2, 2, 512))
    counts = torch.ones(CHUNKED_LOSS_VOCAB, dtype=torch.long)
    caches = []
    new_cache = model.new_cache
    model.new_cache = lambda *args: caches.append(new_cache(*args)) or caches[-1]
    amp = torch.autocast("cpu", dtype=torch.bfloat16)
    with torch.no_grad():
        loss = score_batch(model, x, y, Tally(counts), amp)
        reference = model(x, y)[1]  # fp32, whole
    assert caches and all(c.k.dtype == torch.bfloat16 for c in caches)
    assert loss.item() == pytest.approx(reference.item(), abs=0.02)  # bf16's rounding, not another score


@pytest.mark.slow  # aot_eager traces forward and backward: a few seconds
def test_the_chunked_loss_computes_in_autocasts_dtype_eager_and_compiled_alike():
    """Compiled graphs run with autocast off (AOTAutograd): the operator takes its compute dtype as an argument, so
    under bf16 autocast the compiled step computes the head in bf16 as eager does, not in fp32."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=CHUNKED_LOSS_VOCAB, block_size=32, n_layer=1, n_head=2, n_embd=64))
    x, y = torch.randint(0, CHUNKED_LOSS_VOCAB, (2, 4, 32))
    def loss_and_grad(fn, dtype):
        model.zero_grad()
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            logits, loss = fn(x, y)
        loss.backward()
        assert logits is None  # the chunked path
        return loss.item(), model.lm_head.weight.grad.clone()
    eager, eager_grad = loss_and_grad(model, torch.bfloat16)
    torch._dynamo.reset()
    compiled, compiled_grad = loss_and_grad(torch.compile(model, backend="aot_eager"), torch.bfloat16)
    fp32, fp32_grad = loss_and_grad(model, torch.float32)
    def off(a, b):
        return ((a - b).norm() / b.norm()).item()
    assert abs(compiled - eager) <= 1e-6 and off(compiled_grad, eager_grad) <= 1e-6
    assert off(fp32_grad, eager_grad) > 1e-3  # bf16's matmuls, which a compiled fp32 head would not reproduce
