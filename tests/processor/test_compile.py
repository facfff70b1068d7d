"""``torch.compile`` of the processor (inductor, CPU) gives eager's numbers, forward and backward."""

import torch

from processor import TransformerProcessor


def test_compiled_processor_matches_eager():
    torch.manual_seed(0)
    model = TransformerProcessor(2, 32, 4, window_size=16, mlp_hidden_ratio=2, num_chunks=0, qk_norm=True)
    x = torch.randn(1, 300, 32, requires_grad=True)  # long enough for the blocked kernel's interior and edges

    eager = model(x)
    eager.square().sum().backward()
    eager_grads = [x.grad.clone()] + [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    x.grad = None

    compiled = torch.compile(model)(x)
    compiled.square().sum().backward()
    compiled_grads = [x.grad] + [p.grad for p in model.parameters()]

    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
    for got, want in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
