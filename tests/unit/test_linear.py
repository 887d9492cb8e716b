import pytest
import torch
import torch.nn.functional as F

from specdec.models.linear import Linear


@pytest.mark.parametrize("shape", [(1, 1, 48), (1, 5, 48), (3, 4, 48), (2, 40, 48)])
@pytest.mark.parametrize("bias", [True, False])
def test_matches_f_linear_for_every_row_count(shape, bias):
    torch.manual_seed(0)
    layer = Linear(48, 24, bias=bias)
    x = torch.randn(shape)
    out = layer(x)
    assert out.shape == (*shape[:-1], 24)
    torch.testing.assert_close(out, F.linear(x, layer.weight, layer.bias))
