"""Convergence: the Triton model's loss curve tracks its PyTorch twin's from one initialization."""

import pytest

from tritonformer import convergence


def test_verdict_applies_the_rule_to_loss_curves():
    curves = {"tritonformer": [5.5, 3.0, 2.50], "torch": [5.5, 3.01, 2.49], "torch-fp32": [5.5, 3.0, 2.48]}
    v = convergence.verdict(curves)
    assert v["torch_bf16_deviation"] == pytest.approx(0.01) and v["tritonformer_deviation"] == pytest.approx(0.02)
    assert v["bound"] == pytest.approx(0.02 + convergence.SLACK) and v["tracks"]
    curves["tritonformer"][1] = 3.2
    assert not convergence.verdict(curves)["tracks"]
    assert "| 100 | 3.2000 | 3.0100 | 3.0000 |" in convergence.markdown(curves, 100, 200)


@pytest.mark.gpu(reason="300 training steps of three models: seconds on a GPU, hours in the interpreter")
@pytest.mark.torch_dynamo  # the training loop's AdamW step imports torch._dynamo
@pytest.mark.parametrize("preset", ["tiny", "tiny-llama"])
def test_transformer_tracks_its_twin(preset):
    curves = convergence.loss_curves(preset, steps=300, batch_size=16, seq_len=64, eval_interval=50)
    print(convergence.markdown(curves, 50, 300))
    v = convergence.verdict(curves)
    assert v["tracks"], v
    assert curves["tritonformer"][-1] < 0.6 * curves["tritonformer"][0]  # the loss clearly falls
