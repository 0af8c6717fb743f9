"""The memory contract of `--backend c` (DESIGN.md "Memory design"): bytes kept for backward per conv-output
element. Eager PyTorch keeps three tensors per Conv-BN-SiLU layer (conv output z, BN output, SiLU output: 6 B
per element under fp16 autocast); the c backend keeps only z (2 B) plus per-channel statistics.

Measured two ways on the same models (a module whose `.model` holds the layers, as apply() expects, and whose
output is materialised at the end):
- GPU (marked cuda; the contract as DESIGN.md states it): fp16 autocast forward in training mode, input and
  parameters allocated first; saved = torch.cuda.memory_allocated after the forward − before − the returned
  output. c ≤ 2.1 B per conv-output element, torch ≥ 5. After backward nothing is left but the gradients.
- CPU (always runs, float32): every tensor autograd saves, through torch.autograd.graph.saved_tensors_hooks,
  counted once per storage, parameters and input excluded. The same bounds in float32 bytes: c ≤ 4.2, torch ≥ 10.

Cases:
- 6 × Conv(64→64, 3×3) (GPU: on (8, 64, 128, 128)). Per layer output L elements: torch keeps z, the BN output
  and the SiLU output (the next conv's input) of every layer except the last SiLU output (it is the returned
  output): (6·3 − 1)·2 B / 6 = 5.67 B/elt. c keeps the six z: 2.0.
- RepNCSPELAN4(64→64, c3=64, c4=32, c5=1): twelve conv outputs of 416 channels in all (cv1 64; each RepNCSP
  16+16+2·16 (RepConvN's two branches)+16+32 = 112; the two 3×3 Convs 32 each; cv4 64). c keeps exactly those
  z: 2.0 B per conv-output element. A stored concat would add at least its smallest one, RepNCSP's 32 channels
  (32/416·2 = 0.154 B/elt), so the bound 2.1 also shows that no concat (cv4's 128-channel input, RepNCSP's
  32-channel ones) and no residual sum is stored. torch stores them all: ≈ 5.85 B/elt.

Run: python -m pytest -q tests/backends/test_memory_contract.py   (the cuda cases on a GPU machine)
"""

import pytest
import torch
import torch.nn as nn

from saved_tensors import saved_bytes
from yolov9c.models.common import Conv, RepNCSPELAN4

C_MAX = 2.1  # B per conv-output element kept by the c backend (fp16); 2.0 is the z's alone
TORCH_MIN = 5.0  # eager PyTorch keeps ≈ 6
GELAN_CONV_CHANNELS = 416  # sum of the conv-output channels of RepNCSPELAN4(64, 64, 64, 32, 1), see above

pytestmark = pytest.mark.usefixtures("one_thread")


class Layers(nn.Module):
    """Layers run in sequence, with the .model/.i/.f structure yolov9c.backends.apply reads; the output is a
    plain tensor (a lazy value from the c backend is materialised, as a detect head would)."""

    def __init__(self, layers):
        super().__init__()
        for i, m in enumerate(layers):
            m.i, m.f = i, -1
        self.model = nn.Sequential(*layers)

    def forward(self, x):
        from yolov9c.backends.c.lazy import materialise_any

        for m in self.model:
            x = m(x)
        return materialise_any(x)


def conv_stack(c=64, n=6):
    return Layers([Conv(c, c, 3, 1) for _ in range(n)]), n * c


def gelan_block():
    return Layers([RepNCSPELAN4(64, 64, 64, 32, 1)]), GELAN_CONV_CHANNELS


CASES = {"conv_stack": conv_stack, "gelan": gelan_block}


def _build(case, backend, device):
    from yolov9c.backends import apply

    torch.manual_seed(0)
    model, out_channels = CASES[case]()
    model = model.to(device).train()
    apply(model, backend)
    return model, out_channels


# ---------------------------------------------------------------------------------------------------------
# CPU: what autograd saves, counted through saved-tensor hooks (float32)
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", list(CASES))
def test_saved_tensors_cpu(case):
    got = {}
    for backend in ("torch", "c"):
        model, channels = _build(case, backend, "cpu")
        x = torch.randn(2, 64, 16, 16)  # per-channel statistics add 8 B per channel per conv: 0.016 B/elt here
        nbytes, out = saved_bytes(model, x, count_output=False)
        got[backend] = nbytes / (out.numel() // out.shape[1] * channels)
        out.sum().backward()  # the saved tensors are enough for backward
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    # float32: 4 B per stored element
    assert got["c"] <= 2 * C_MAX, f"{case}: c backend saves {got['c']:.3f} B per conv-output element (fp32)"
    assert got["torch"] >= 2 * TORCH_MIN, f"{case}: torch backend saves {got['torch']:.3f} B/elt (fp32)"


# ---------------------------------------------------------------------------------------------------------
# GPU: the allocator's view under fp16 autocast (the contract of DESIGN.md)
# ---------------------------------------------------------------------------------------------------------

def measure_cuda(model, x):
    """Forward under fp16 autocast, then backward. Returns (saved bytes, returned-output bytes, forward peak
    above the start, bytes still allocated after backward above the start, conv-output elements)."""
    dev = x.device
    torch.cuda.synchronize(dev)
    before = torch.cuda.memory_allocated(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    with torch.autocast("cuda", dtype=torch.float16):
        out = model(x)
    torch.cuda.synchronize(dev)
    after = torch.cuda.memory_allocated(dev)
    peak = torch.cuda.max_memory_allocated(dev) - before
    out_bytes = out.numel() * out.element_size()
    out.float().sum().backward()
    del out
    torch.cuda.synchronize(dev)
    left = torch.cuda.memory_allocated(dev) - before
    return after - before - out_bytes, out_bytes, peak, left


@pytest.mark.cuda
@pytest.mark.parametrize("case", list(CASES))
def test_saved_bytes_per_output_element_cuda(case):
    dev = torch.device("cuda", 0)
    per_elt, report = {}, []
    for backend in ("torch", "c"):
        model, channels = _build(case, backend, dev)
        x = torch.randn(8, 64, 128, 128, device=dev, dtype=torch.float16)
        measure_cuda(model, x)  # warm-up: lazily created handles and workspaces are then counted in "before"
        for p in model.parameters():
            p.grad = None
        saved, out_bytes, peak, left = measure_cuda(model, x)
        n_out = 8 * 128 * 128 * channels  # every conv layer keeps the 128×128 resolution
        per_elt[backend] = saved / n_out
        report.append(f"{backend}: saved {saved / 2**20:.1f} MiB = {per_elt[backend]:.3f} B/elt, forward peak "
                      f"{peak / 2**20:.1f} MiB, output {out_bytes / 2**20:.1f} MiB")
        grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        # after backward only the parameter gradients remain (allocator blocks of 512 B: small slack)
        assert left <= grads + 2**20, f"{case} {backend}: {left - grads} bytes left after backward; " + \
            "; ".join(report)
        del model, x
        torch.cuda.empty_cache()
    msg = f"{case}: " + "; ".join(report)
    print(msg)
    assert per_elt["c"] <= C_MAX, msg
    assert per_elt["torch"] >= TORCH_MIN, msg
