"""Head scores on hand-built attention maps, where the right answer is known, and on a real GPT's maps."""
import torch

from attnlab.heads import head_scores, induction_scores, previous_token_scores, repeated_tokens
from model import GPT, GPTConfig

LENGTH = 5  # the repeated segment
T = 2 * LENGTH


def map_on(keys):
    """(1, 1, T, T) attention whose query t puts all its weight on keys[t]."""
    a = torch.zeros(1, 1, T, T)
    a[0, 0, torch.arange(T), torch.tensor(keys)] = 1.0
    return a


def test_repeated_tokens_repeat_a_random_segment():
    x = repeated_tokens(50, LENGTH, 3, torch.Generator().manual_seed(0))
    assert x.shape == (3, T)
    assert torch.equal(x[:, :LENGTH], x[:, LENGTH:])


def test_a_previous_token_head_scores_one_there_and_nothing_as_induction():
    previous = map_on([0] + list(range(T - 1)))  # query 0 can only look at itself
    assert previous_token_scores([previous]).item() == 1.0
    assert induction_scores([previous], LENGTH).item() == 0.0


def test_an_induction_head_looks_after_the_earlier_occurrence():
    keys = list(range(LENGTH)) + [t - LENGTH + 1 for t in range(LENGTH, T)]  # the first copy: itself
    induction = map_on(keys)
    assert induction_scores([induction], LENGTH).item() == 1.0
    assert previous_token_scores([induction]).item() == 0.0


def test_scores_are_per_layer_and_head_and_average_their_queries():
    uniform = torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1)[:, None]  # (T, T) even over what each sees
    maps = [uniform.expand(1, 2, T, T)] * 3  # 3 layers of 2 heads, batch 1
    previous, induction = previous_token_scores(maps), induction_scores(maps, LENGTH)
    assert previous.shape == induction.shape == (3, 2)
    assert torch.allclose(previous, (1 / torch.arange(2, T + 1)).mean())
    assert torch.allclose(induction, (1 / torch.arange(LENGTH + 1, T + 1)).mean())


def test_head_scores_of_a_gpt_are_weights():
    model = GPT(GPTConfig(vocab_size=20, block_size=16, n_layer=2, n_head=3, n_embd=12)).eval()
    previous, induction = head_scores(model, seed=0)
    assert previous.shape == induction.shape == (2, 3)
    assert ((previous >= 0) & (previous <= 1) & (induction >= 0) & (induction <= 1)).all()
    assert torch.equal(previous, head_scores(model, seed=0)[0])  # seeded: the same page twice
