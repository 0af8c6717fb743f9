"""What autograd saves for backward in a forward pass, counted through saved-tensor hooks, and the CUDA peak of a
step: the helpers of the memory tests (tests/backends/test_memory_contract.py, test_backend_pgi.py,
test_plain_stride.py)."""

import torch


def saved_bytes(model, x, count_output=True):
    """(bytes of the distinct storages autograd saves in model(x), excluding the parameters and x, and the
    output's own storage unless count_output; the output)."""
    skip = {p.untyped_storage().data_ptr() for p in model.parameters()} | {x.untyped_storage().data_ptr()}
    seen = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in skip:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(x)
    if not count_output:
        seen.pop(out.untyped_storage().data_ptr(), None)
    return sum(seen.values()), out


def cuda_step_peak(step, params):
    """(step()'s result, its peak allocated CUDA bytes above what was allocated before it, less params' float32
    gradients) for the second call of step(): the first is a warm-up (cuDNN choices, lazily created handles),
    after which params' gradients are cleared."""
    step()
    for p in params:
        p.grad = None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = step()
    torch.cuda.synchronize()
    grads = sum(p.grad.numel() * 4 for p in params if p.grad is not None)
    return out, torch.cuda.max_memory_allocated() - before - grads
