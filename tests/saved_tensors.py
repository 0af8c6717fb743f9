"""What autograd saves for backward in a forward pass, counted through saved-tensor hooks: the helper of the
memory tests (tests/backends/test_memory_contract.py, tests/backends/test_backend_pgi.py)."""

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
