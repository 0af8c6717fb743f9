"""The recomputed PGI auxiliary branch and the uint8 input of `--backend c` (backends/c/pgi.py, segment.py).

- Split: the auxiliary layers read off the graph are the ones the yaml files mark as the auxiliary branch
  (t/s: the second FPN; m/c: CBLinear + second backbone; e: the FPN on the first backbone).
- Same results: with the recompute (Switches.aux_recompute, the default) the head maps, the loss, every
  parameter gradient and every BN buffer equal the stored path's (aux_recompute=False) within 1e-5
  norm-relative (measured on the CPU: bit-identical for yolov9-t, 1.8e-6 for the gradients of yolov9-c, whose
  second stem runs first and so sums some gradients in another order), num_batches_tracked counts one update per step (the
  recompute takes the forward's statistics back from the tape and updates nothing). That the recompute's
  gradients and BN buffers are as close to a float64 copy as the torch backend's is tests/backends/test_backend_c.py's
  test_model_matches_torch / test_yolov9c_matches_torch: the recompute is the default there, on the same seeded
  yolov9-t / yolov9-c, input and targets as here.
- Memory (CPU, saved-tensor hooks; float32): what forward stores with the recompute is at most the main
  branch's conv outputs plus a quarter of the auxiliary ones (the segment outputs), while the stored path
  keeps all of them — the bound is derived from the conv-output count of each part (torch-backend hooks).
  Inputs 2 × 64² (as 2 × 128², at a quarter of the CPU time; measured: stored / bound 0.91 (t) and 0.94 (c)
  with the recompute, 1.20 and 1.53 without; at 128² 0.88 / 0.92 and 1.17 / 1.50).
- uint8 input: a uint8 batch gives bit-identical maps, loss and gradients to the float batch / 255, the
  float image is never stored (no saved tensor of the image's float32 size), eval mode converts up front.
- Main blocks (Switches.main_recompute): the backbone blocks at stride ≤ 8 run as recomputed segments with the
  same maps, loss, gradients and BN buffers as the plain path, and what forward stores falls by their inner z's
  (all but each block's last conv output; measured at 2 × 64²: 1.004-1.012 times them, asserted ≥ 0.9; CUDA:
  the peak falls by at least half of them in fp16).
- Kept conv inputs (Switches.keep_inputs, conv.inputs_kept): a segment's backward recompute hands each conv the
  input it materialised to its own backward. Bit-identical maps, loss, gradients, BN buffers and stored bytes to
  re-activating the input there (fp32 and CPU bf16 autocast); every kept input is freed before its segment's
  backward returns; and backward applies BN+SiLU to exactly as many z elements as forward (each conv input once:
  in its conv's backward, or in its segment's recompute), where it applied 1.5x as many without the reuse
  (yolov9-t at 64 px: 1.376 against 2.057 passes over every z; dev/probes/bn_passes.py at 128 px: 1.35 against
  2.01).
- CUDA (marked cuda): the peak allocated memory of forward + loss + backward (yolov9-c, 8 × 320², fp16) with
  the recompute is below the stored path's by at least half of the auxiliary z's (2 B per auxiliary
  conv-output element): the main and auxiliary z's are never all alive together.
Run: python -m pytest -q tests/backends/test_backend_pgi.py
"""

import contextlib
import copy

import pytest
import torch
import torch.nn as nn

from saved_tensors import cuda_step_peak, saved_bytes
from seeded_models import seeded_model, shared_seeded_model
from yolov9c.api import build_model, make_loss
from yolov9c.backends import accepts_uint8, apply
from yolov9c.backends.c import conv, pgi, segment
from yolov9c.backends.c.switches import Switches
from yolov9c.ops import extension

SAME = 1e-5  # recompute vs stored path, norm-relative: the same kernels, gradients summed in another order
TARGETS = torch.tensor([[0, 1, 0.5, 0.5, 0.3, 0.4], [1, 2, 0.3, 0.6, 0.2, 0.25], [0, 0, 0.7, 0.3, 0.2, 0.3]])


@pytest.fixture(autouse=True)
def _threads():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def err(a, ref):
    a, ref = a.detach().double(), ref.detach().double()
    return ((a - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def flat(o):
    return [t for v in (o if isinstance(o, (list, tuple)) else [o]) for t in (v if isinstance(v, list) else [v])]


def err_all(ts, refs):
    """err(cat(ts), cat(refs)) without the concatenations: the largest difference and the largest reference
    element are maxima, taken tensor by tensor in float64 (the same number; for yolov9-c's 51 M gradients the two
    float64 copies cost ~3 s of CPU per comparison, mostly page faults)."""
    diffs, scales = [], []
    for a, ref in zip(ts, refs, strict=True):
        if ref.numel():
            a, ref = a.detach().double(), ref.detach().double()
            diffs.append((a - ref).abs().max())  # NaN propagates, as in err
            scales.append(ref.abs().max())
    return (torch.stack(diffs).max() / torch.stack(scales).max().clamp_min(1e-30)).item()


@pytest.mark.parametrize("cfg, aux", [
    ("yolov9-s", set(range(22, 29))), ("yolov9-c", set(range(23, 38))), ("yolov9-e", set(range(29, 36)))])
def test_aux_split(cfg, aux):
    m = shared_seeded_model(cfg)  # Graph only reads the model
    g = pgi.Graph(m)
    assert g.aux == aux
    order = [i for kind, w in g.steps for i in ([w] if kind == "layer" else w if kind == "segment" else [])]
    n = len(m.model) - 1
    assert sorted(order) == list(range(n))  # every layer once
    pos = {i: k for k, i in enumerate(order)}
    for i in order:  # a valid order: every layer after what it reads
        assert all(pos[j] < pos[i] for j in pgi.inputs_of(m.model[i]) if j >= 0)
    # every auxiliary layer runs before every main layer the auxiliary branch does not read (the neck): its
    # backward then comes after the whole neck's
    feeds, todo = set(), [j for i in aux for j in pgi.inputs_of(m.model[i])]
    while todo:  # the layers the auxiliary branch reads, transitively
        j = todo.pop()
        if j >= 0 and j not in feeds:
            feeds.add(j)
            todo.extend(pgi.inputs_of(m.model[j]))
    neck = [i for i in order if i not in aux and i not in feeds]
    assert neck and max(pos[i] for i in aux) < min(pos[i] for i in neck)


def _run(base, x, recompute):
    """(maps, loss, parameter gradients, buffers) of one c training step of a copy of base."""
    m = apply(copy.deepcopy(base), "c", Switches(aux_recompute=recompute))
    return _backward(m, m(x))


def _backward(m, out):
    """(maps, loss, parameter gradients, buffers) after the loss of m's forward output `out` and its backward."""
    loss, _ = make_loss(m)(out, TARGETS)
    loss.backward()
    return flat(out), loss.detach(), [p.grad for p in m.parameters()], [b.detach().clone() for b in m.buffers()]


@pytest.mark.parametrize("cfg", ["yolov9-t", "yolov9-c"])
def test_recompute_equals_stored(cfg):
    base = shared_seeded_model(cfg)
    x = torch.rand(2, 3, 64, 64)
    rec = _run(base, x, True)
    sto = _run(base, x, False)
    for a, b in zip(rec[0], sto[0]):
        assert err(a, b) <= SAME
    assert err(rec[1], sto[1]) <= SAME
    assert [g is None for g in rec[2]] == [g is None for g in sto[2]]
    got = [i for i, g in enumerate(rec[2]) if g is not None]
    assert err_all([rec[2][i] for i in got], [sto[2][i] for i in got]) <= SAME
    for a, b in zip(rec[3], sto[3]):
        assert torch.equal(a, b) if not a.dtype.is_floating_point else err(a, b) <= SAME
    before = [b for b in base.buffers() if not b.dtype.is_floating_point]
    ints = [b for b in rec[3] if not b.dtype.is_floating_point]
    assert ints and all(int(b) == int(b0) + 1 for b, b0 in zip(ints, before))  # one BN update per step


def test_recompute_state_dict_unchanged():
    m = seeded_model("yolov9-t")
    keys = list(m.state_dict())
    apply(m, "c")
    loss, _ = make_loss(m)(m(torch.rand(2, 3, 64, 64)), TARGETS)
    loss.backward()
    assert list(m.state_dict()) == keys
    apply(m, "torch")
    assert "forward" not in m.__dict__ and not accepts_uint8(m)


# ------------------------------------------------------------------------------------------------ memory

def conv_outputs(m, x):
    """Conv-output elements (every nn.Conv2d of the training graph of model `m`, torch backend) of the main and
    the auxiliary part."""
    m = m.train().to(x.device)
    g = pgi.Graph(m)
    head = m.model[-1]
    aux_mods = {id(c) for i in g.aux for c in m.model[i].modules()}
    aux_mods |= {id(c) for k in range(head.nl) for s in (head.cv2[k], head.cv3[k]) for c in s.modules()}
    counts = {"main": 0, "aux": 0}

    def hook(mod, inp, out):
        counts["aux" if id(mod) in aux_mods else "main"] += out.numel()

    hs = [c.register_forward_hook(hook) for c in m.modules() if isinstance(c, nn.Conv2d)]
    with torch.no_grad():
        m(x.float() / 255 if x.dtype == torch.uint8 else x)
    for h in hs:
        h.remove()
    return counts


@pytest.mark.parametrize("cfg", ["yolov9-t", "yolov9-c"])
def test_recompute_stores_main_branch_only_cpu(cfg):
    x = torch.rand(2, 3, 64, 64)
    base = shared_seeded_model(cfg)
    z = conv_outputs(copy.deepcopy(base), x)
    head_bytes = None
    got = {}
    for recompute in (True, False):  # the auxiliary split alone (main blocks: below)
        m = apply(copy.deepcopy(base), "c", Switches(aux_recompute=recompute, main_recompute=0))
        nbytes, out = saved_bytes(m, x)
        head_bytes = sum(t.numel() * 4 for t in flat(out))
        got[recompute] = nbytes
    bound = 4 * (z["main"] + 0.25 * z["aux"]) + head_bytes
    msg = f"{cfg}: stored {got[True] / 2**20:.2f} MiB (recompute) / {got[False] / 2**20:.2f} MiB (stored), " \
          f"bound {bound / 2**20:.2f} MiB, z main {z['main']} aux {z['aux']}"
    assert got[True] <= bound, msg
    assert got[False] > bound, msg


# ------------------------------------------------------------------------------------------------ kept inputs

def _no_kept_inputs(mp):
    """The recompute without conv.inputs_kept: every conv backward in it activates its input again."""
    mp.setattr(segment, "inputs_kept", contextlib.nullcontext)


KEEP = Switches(aux_recompute=True, main_recompute=8, keep_inputs=True)


def _step(base, x, amp=False):
    """(maps, loss, parameter gradients, buffers, stored bytes) of one c training step of a copy of base with
    the kept inputs switched on (KEEP)."""
    m = apply(copy.deepcopy(base), "c", KEEP)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        nbytes, out = saved_bytes(m, x)
    loss, _ = make_loss(m)(out, TARGETS)
    loss.backward()
    return flat(out), loss.detach(), [p.grad for p in m.parameters()], list(m.buffers()), nbytes


def _same(a, b):
    return (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))


@pytest.mark.parametrize("cfg, amp", [("yolov9-t", False), ("yolov9-t", True), ("yolov9-c", False)])
def test_kept_inputs_bit_identical_and_freed_per_segment(cfg, amp):
    base = shared_seeded_model(cfg)
    x = torch.rand(2, 3, 64, 64)
    live = {"now": 0, "made": 0, "left": []}

    class Counted(conv.KeptInput):
        __slots__ = ()

        def __init__(self, *args):
            super().__init__(*args)
            live["now"] += 1
            live["made"] += 1

        def __del__(self):
            live["now"] -= 1

    backward = segment.SegmentFunction.backward

    def checked(ctx, *grads):
        got = backward(ctx, *grads)
        live["left"].append(live["now"])  # kept inputs still alive when a segment's backward returns
        return got

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conv, "KeptInput", Counted)
        mp.setattr(segment.SegmentFunction, "backward", staticmethod(checked))
        kept = _step(base, x, amp)
    with pytest.MonkeyPatch.context() as mp:
        _no_kept_inputs(mp)
        again = _step(base, x, amp)
    assert live["made"] > 0 and live["left"] and set(live["left"]) == {0}, live
    assert all(map(_same, kept[0], again[0])) and _same(kept[1], again[1])
    assert all(map(_same, kept[2], again[2])) and all(map(_same, kept[3], again[3]))
    assert kept[4] == again[4]  # forward stores the same bytes


def bn_inputs(base, x):
    """Elements of every BatchNorm2d input in one torch forward of base: one pass over every z."""
    m = copy.deepcopy(base)
    total = [0]
    for b in m.modules():
        if isinstance(b, nn.BatchNorm2d):
            b.register_forward_hook(lambda mod, inp, out: total.__setitem__(0, total[0] + inp[0].numel()))
    with torch.no_grad():
        m(x)
    return total[0]


def activated(base, x, switches):
    """Elements of z the BN+SiLU apply kernels read in forward and in backward of one c training step."""
    m = apply(copy.deepcopy(base), "c", switches)
    with extension.count_calls() as n:   # elements: z of each BN operand of bn_silu.forward
        loss, _ = make_loss(m)(m(x), TARGETS)
        fwd = n.elements["bn_silu_forward"]
        loss.backward()
    return fwd, n.elements["bn_silu_forward"] - fwd


def test_backward_activates_each_conv_input_once():
    base = shared_seeded_model("yolov9-t")
    x = torch.rand(2, 3, 64, 64)
    one = bn_inputs(base, x)
    fwd, bwd = activated(base, x, KEEP)
    msg = f"passes over every z: forward {fwd / one:.3f}, backward {bwd / one:.3f}"
    assert bwd == fwd and bwd <= 1.38 * one, msg  # each conv input activated once in backward (1.376)
    with pytest.MonkeyPatch.context() as mp:
        _no_kept_inputs(mp)
        fwd0, bwd0 = activated(base, x, KEEP)
    assert activated(base, x, Switches()) == (fwd0, bwd0)  # the default: no kept inputs
    msg += f"; without kept inputs: forward {fwd0 / one:.3f}, backward {bwd0 / one:.3f}"
    assert fwd0 == fwd, msg
    assert bwd0 >= 1.4 * bwd, msg  # (2.057) the recompute's conv backwards activated their inputs again


# ------------------------------------------------------------------------------------------------ uint8

def test_uint8_input_same_results_and_not_stored(monkeypatch):
    base = shared_seeded_model("yolov9-c")
    x8 = (torch.rand(2, 3, 64, 64) * 255).to(torch.uint8)
    res = []
    for x in (x8, x8.float() / 255):
        m = apply(copy.deepcopy(base), "c")
        assert accepts_uint8(m)
        nbytes, out = saved_bytes(m, x)
        loss, _ = make_loss(m)(out, TARGETS)
        loss.backward()
        res.append((flat(out), loss.detach(), [p.grad for p in m.parameters()]))
        if x.dtype == torch.uint8:
            kinds = set()
            pack = lambda t: kinds.add((tuple(t.shape), t.dtype)) or t  # noqa: E731
            m2 = apply(copy.deepcopy(base), "c")
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                m2(x)
            image_like = {dt for shape, dt in kinds if shape == tuple(x8.shape)}
            assert image_like == {torch.uint8}, image_like  # the uint8 batch is stored, never a float copy
    (o8, l8, g8), (of, lf, gf) = res
    assert all(torch.equal(a, b) for a, b in zip(o8, of))
    assert torch.equal(l8, lf)
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(g8, gf))


def test_uint8_eval_mode_converts():
    m = apply(seeded_model("yolov9-t"), "c").eval()
    x8 = (torch.rand(1, 3, 64, 64) * 255).to(torch.uint8)
    with torch.no_grad():
        y8, _ = m(x8)
        yf, _ = m(x8.float() / 255)
    assert all(torch.equal(a, b) for a, b in zip(flat(y8), flat(yf)))


# ------------------------------------------------------------------------------------------------ CUDA

def _cuda_peak(cfg, switches, x):
    torch.manual_seed(0)
    m = apply(build_model(cfg, nc=3).cuda().to(memory_format=torch.channels_last).train(), "c", switches)
    loss_fn = make_loss(m, backend="c")
    tg = TARGETS.cuda()

    def step():
        with torch.autocast("cuda", dtype=torch.float16):
            out = m(x)
            loss, _ = loss_fn(out, tg)
        loss.sum().backward()
        return sum(t.numel() * t.element_size() for t in flat(out))

    head, peak = cuda_step_peak(step, list(m.parameters()))
    return peak, head


@pytest.mark.cuda
def test_recompute_peak_below_z_bound_cuda():
    x = torch.randint(0, 256, (8, 3, 320, 320), dtype=torch.uint8, device="cuda")
    x = x.contiguous(memory_format=torch.channels_last)
    torch.manual_seed(0)
    z = conv_outputs(build_model("yolov9-c", nc=3), x)
    # the auxiliary recompute alone (main blocks: below)
    peak_r, head = _cuda_peak("yolov9-c", Switches(aux_recompute=True, main_recompute=0), x)
    peak_s, _ = _cuda_peak("yolov9-c", Switches(aux_recompute=False, main_recompute=0), x)
    bound = peak_s - 0.5 * 2 * z["aux"]
    msg = (f"peak above start: recompute {peak_r / 2**20:.1f} MiB, stored {peak_s / 2**20:.1f} MiB; bound "
           f"{bound / 2**20:.1f} MiB (z main {2 * z['main'] / 2**20:.1f} MiB, aux {2 * z['aux'] / 2**20:.1f} MiB, "
           f"head maps {head / 2**20:.1f} MiB)")
    print(msg)
    assert peak_r <= bound, msg


# ------------------------------------------------------------------------------------------------ main blocks

@pytest.mark.parametrize("cfg, blocks", [
    ("yolov9-s", {2, 4, 6, 8}), ("yolov9-c", {3, 5, 7, 9}), ("yolov9-e", {3, 5, 7, 9, 19, 22, 25, 28})])
def test_main_blocks_are_the_backbone_blocks(cfg, blocks):
    g = pgi.Graph(shared_seeded_model(cfg))
    assert g.blocks == blocks  # RepNCSPELAN4 / ELAN1 of the backbone section; the stride is checked per call


def inner_z(m, x, limit):
    """Conv-output elements inside the main blocks recomputed at stride `limit` (torch backend), less each
    block's last conv output (the z a recomputed block keeps): what the main recompute should not store."""
    m = m.train()
    g = pgi.Graph(m)
    h_img, total, hs = x.shape[2], {"n": 0}, []
    for i in sorted(g.blocks):
        outs = []
        convs = [c for c in m.model[i].modules() if isinstance(c, nn.Conv2d)]
        hs += [c.register_forward_hook(lambda mod, inp, out, outs=outs: outs.append(out.numel())) for c in convs]
        hs.append(m.model[i].register_forward_pre_hook(
            lambda mod, inp, outs=outs: outs.append("stride %d" % (h_img // inp[0].shape[2]))))
        total[i] = outs
    with torch.no_grad():
        m(x)
    for h in hs:
        h.remove()
    for i in sorted(g.blocks):
        stride = int(total[i][0].split()[1])
        if stride <= limit:
            total["n"] += sum(total[i][1:]) - total[i][-1]
    return total["n"]


@pytest.mark.parametrize("cfg", ["yolov9-s", "yolov9-c"])
def test_main_recompute_same_results_and_stores_less(cfg):
    base = shared_seeded_model(cfg)
    x = torch.rand(2, 3, 64, 64)
    got = {}
    for limit in ("8", "4", "0"):  # one training step each: what its forward stores, then its loss and backward
        m = apply(copy.deepcopy(base), "c", Switches(main_recompute=int(limit)))
        nbytes, out = saved_bytes(m, x)
        got[limit] = (nbytes, _backward(m, out))
        del m, out
    plain = got["0"][1]
    idx = [i for i, g in enumerate(plain[2]) if g is not None]
    for limit in ("8", "4"):
        res = got[limit][1]
        assert all(err(a, b) <= SAME for a, b in zip(res[0], plain[0]))
        assert err(res[1], plain[1]) <= SAME
        assert [g is None for g in res[2]] == [g is None for g in plain[2]]
        assert err_all([res[2][i] for i in idx], [plain[2][i] for i in idx]) <= SAME
        for a, b in zip(res[3], plain[3]):  # BN buffers: one update per step, as the plain path
            assert torch.equal(a, b) if not a.dtype.is_floating_point else err(a, b) <= SAME
        saved = got["0"][0] - got[limit][0]
        z = inner_z(copy.deepcopy(base), x, int(limit))
        assert z > 0
        msg = f"{cfg} stride {limit}: stored {got[limit][0] / 2**20:.2f} MiB against {got['0'][0] / 2**20:.2f}; " \
              f"inner z of the recomputed blocks {4 * z / 2**20:.2f} MiB"
        assert saved >= 0.9 * 4 * z, msg  # (float32 here) most of the blocks' inner z's are no longer stored
    assert got["8"][0] < got["4"][0] < got["0"][0]


@pytest.mark.cuda
def test_main_recompute_peak_below_z_bound_cuda():
    """yolov9-c, 8 × 320², fp16: recomputing the stride-4/8 backbone blocks lowers the step's peak (at the start
    of backward, everything stored is alive) by at least half of their inner z's (2 B per element)."""
    x = torch.randint(0, 256, (8, 3, 320, 320), dtype=torch.uint8, device="cuda")
    x = x.contiguous(memory_format=torch.channels_last)
    torch.manual_seed(0)
    z = inner_z(build_model("yolov9-c", nc=3).cuda(), x.float() / 255, 8)
    peaks = {}
    for limit in ("8", "0"):
        peaks[limit], _ = _cuda_peak("yolov9-c", Switches(main_recompute=int(limit)), x)
    bound = peaks["0"] - 0.5 * 2 * z
    msg = (f"peak above start: main recompute {peaks['8'] / 2**20:.1f} MiB, without {peaks['0'] / 2**20:.1f} MiB; "
           f"bound {bound / 2**20:.1f} MiB (inner z of the blocks {2 * z / 2**20:.1f} MiB)")
    print(msg)
    assert peaks["8"] <= bound, msg
