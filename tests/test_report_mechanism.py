"""scripts/report/mechanism.py: the worked example goes through model.py's attention and agrees with the formula."""
import math

import torch

from scripts.report.mechanism import SCORES, example_weights


def test_worked_example_weights_are_the_softmax_of_the_scores_and_the_gradient_its_jacobian():
    weights, grad = example_weights(SCORES)
    p = torch.tensor([math.exp(s) for s in SCORES])
    p /= p.sum()  # the softmax written out
    assert torch.allclose(weights, p, atol=1e-6)
    top = int(p.argmax())
    jacobian_row = p[top] * ((torch.arange(len(p)) == top).float() - p)  # ∂p_top / ∂s_j
    assert torch.allclose(grad, jacobian_row, atol=1e-6)
    assert [round(w, 3) for w in weights.tolist()] == [0.061, 0.225, 0.41, 0.304]  # not the explainers' rounding


def test_worked_example_causal_row_sees_only_the_past_and_unscaled_saturates():
    causal, _ = example_weights(SCORES, causal_row=1)
    assert causal[2:].eq(0).all() and torch.allclose(causal[:2], torch.tensor(SCORES[:2]).softmax(0), atol=1e-6)
    scaled, grad_scaled = example_weights(SCORES, d_k=64)
    raw, grad_raw = example_weights([s * 8 for s in SCORES], d_k=64)  # the same q·k without dividing by √64
    assert raw.max() > 0.9 > scaled.max() and grad_raw.abs().min() < 1e-3 * grad_scaled.abs().min()
