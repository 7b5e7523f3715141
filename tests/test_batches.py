"""Properties of attnlab.batches.get_batch, the data loader, for any corpus length and batch shape (hypothesis).
CPU, seconds."""
import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab import batches as batches_module
from attnlab.batches import get_batch

CPU = torch.device("cpu")


@st.composite
def corpora(draw):
    """A corpus of n >= block_size + 1 tokens whose token at position i is i, so a token tells where it came from."""
    block_size = draw(st.integers(1, 64))
    n = draw(st.integers(block_size + 1, block_size + 2000))
    return np.arange(n, dtype=np.uint16), block_size


@settings(max_examples=200, deadline=None)
@given(corpora(), st.integers(1, 16), st.integers(0, 2**32 - 1))
def test_batches_are_windows_of_the_corpus_with_targets_shifted_by_one(corpus, batch_size, seed):
    data, block_size = corpus
    x, y = get_batch(data, batch_size, block_size, torch.Generator().manual_seed(seed), CPU)
    assert x.shape == y.shape == (batch_size, block_size) and x.dtype == y.dtype == torch.int64
    assert torch.equal(y, x + 1)  # each target is the token after its input
    assert torch.equal(x - x[:, :1], torch.arange(block_size).expand_as(x))  # contiguous windows
    assert x.min() >= 0 and y.max() <= len(data) - 1  # never past either end


def test_shortest_corpus_has_exactly_one_window():
    data = np.arange(9, dtype=np.uint16)
    x, y = get_batch(data, 4, 8, torch.Generator().manual_seed(0), CPU)
    assert torch.equal(x, torch.arange(8).expand(4, 8)) and torch.equal(y, x + 1)


def test_every_window_can_be_drawn():
    data = np.arange(12, dtype=np.uint16)
    x, _ = get_batch(data, 2000, 8, torch.Generator().manual_seed(0), CPU)
    assert set(x[:, 0].tolist()) == {0, 1, 2, 3}  # starts 0..n-T-1: the last window ends on the last token


def test_a_micro_batch_is_one_contiguous_copy_sliced_where_it_lands(monkeypatch):
    """Copying the strided views x and y would go through a temporary in pageable memory on CUDA (pinning keeps the
    strides); one (B, T + 1) tensor is copied, pinned where pinning is available, and sliced on the device."""
    copied = []
    def to_device(tensor, device):
        copied.append(tensor)
        return tensor.pin_memory() if torch.cuda.is_available() else tensor
    monkeypatch.setattr(batches_module, "to_device", to_device)
    x, y = get_batch(np.arange(100, dtype=np.uint16), 4, 8, torch.Generator().manual_seed(0), CPU)
    [batch] = copied
    assert batch.shape == (4, 9) and batch.is_contiguous()
    assert x.data_ptr() == batch.data_ptr() and torch.equal(y, batch[:, 1:])  # views of the one copy
    if torch.cuda.is_available():
        assert x.is_pinned()
