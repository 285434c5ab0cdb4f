"""Alg. 1 (core/pwan/alg1.py): the hand-written gradients equal autograd's (incl. the gradient
penalty's double backward), member states map exactly onto PotentialNet, starts do not interact,
the fused Adam is torch's Adam, and both gradient functions compile whole (fullgraph, no graph
break)."""

import warnings

import numpy as np
import pytest
import torch

from _core_shapes import blob, rot3
from pwan_ros.core import RegistrationConfig
from pwan_ros.core.pwan.acceleration import FusedAdam
from pwan_ros.core.problem import SampledProblem
from pwan_ros.core.pwan.alg1 import Alg1, Schedule, Starts, run_alg1
from pwan_ros.core.pwan.gradients import Penalty, potential_grads, transform_input_grad
from pwan_ros.core.pwan.coherence import Coherence
from pwan_ros.core.config import PotentialConfig
from pwan_ros.core.pwan.potential import (
    BatchedPotential,
    PotentialNet,
    gradient_penalty,
    split,
    tangent_rows,
)
from pwan_ros.core.pwan.transforms import BatchedTransform
from pwan_ros.core.preprocess import make_normaliser


def _net(count=2, hidden=(32, 32), seed=1):
    net = BatchedPotential(
        count, 3, PotentialConfig(hidden=hidden), torch.Generator().manual_seed(seed)
    )
    with torch.no_grad():
        net.h.copy_(torch.linspace(0.4, 0.9, count))
    return net


@pytest.mark.parametrize('closed_form', [False, True], ids=['learned_h', 'closed_form_h'])
@pytest.mark.parametrize('hidden', [(32, 32), (16, 8)])
def test_potential_gradient_equals_autograd_with_double_backward(closed_form, hidden):
    """The update's gradient (KR objective + penalty at random points, summed over 3 starts)
    against PotentialNet + autograd with create_graph=True, start by start. The weights are
    scaled so that the penalty is active at some of its points and not at others (at the
    initialisation |grad g| < 0.2 everywhere: the penalty, the tangent rows' pass, would be 0)."""
    torch.manual_seed(0)
    s = 3
    net = _net(s, hidden)
    with torch.no_grad():
        net.theta.mul_(2.5)
    xb = torch.randn(1, 40, 3).expand(s, -1, -1)
    zb = torch.randn(s, 30, 3) * 1.5
    coef = torch.tensor([40 / 30, (20 - 30) / 30])
    gi = torch.randint(70, (16,))
    ws, bs = net.views()
    flat = potential_grads(
        net.weights(),
        net.h,
        xb,
        zb,
        coef,
        Penalty(gi, tangent_rows(16, 3, torch.float32, 'cpu'), 10.0),
        'closed_form' if closed_form else 'learn',
    )
    gw, gb = split(flat, [w.shape for w in ws])
    for i in range(s):
        ref = PotentialNet(3, PotentialConfig(hidden=hidden))
        ref.load_state_dict(net.state(i))
        gx, gy = ref.raw(xb[i]).abs(), ref.raw(zb[i]).abs()
        # closed form: h = max |g| (no gradient; the maximiser itself counts as inside the clip)
        h = torch.maximum(gx.max(), gy.max()).detach() + 1e-4 if closed_form else ref.h
        val = coef[0] * (-gx).mean() + torch.minimum(gy, h).mean() + coef[1] * h
        gp = gradient_penalty(ref, torch.cat((xb[i], zb[i]))[gi])
        xg = torch.cat((xb[i], zb[i]))[gi].requires_grad_(True)
        (slope,) = torch.autograd.grad(ref.raw(xg).sum(), xg)
        steep = (slope.pow(2).sum(1) > 1.0).float().mean()
        assert 0.0 < steep < 1.0 and gp > 0  # the penalty counts at some points, not all
        loss = -val + 10.0 * gp
        loss.backward()
        for k, lin in enumerate([ref.l1, ref.l2, ref.l3, ref.l4, ref.l5]):
            torch.testing.assert_close(gw[k][i], lin.weight.grad.T, rtol=1e-4, atol=2e-5)
            torch.testing.assert_close(gb[k][i, 0], lin.bias.grad, rtol=1e-4, atol=2e-5)
        dh = flat[-s:][i]
        if closed_form:
            assert dh == 0
        else:
            torch.testing.assert_close(dh, ref.h.grad, rtol=1e-4, atol=1e-6)


def test_transform_gradient_equals_autograd():
    net = _net(2)
    z = torch.randn(2, 50, 3)
    dz = transform_input_grad(net.weights(), net.h, z)
    for i in range(2):
        ref = PotentialNet(3, PotentialConfig(hidden=(32, 32)))
        ref.load_state_dict(net.state(i))
        zi = z[i].clone().requires_grad_(True)
        torch.minimum(ref.raw(zi).abs(), ref.h.detach()).mean().backward()
        torch.testing.assert_close(dz[i], zi.grad, rtol=1e-4, atol=1e-6)


def test_workspace_reuses_its_buffers_and_changes_nothing():
    """With a Workspace (Alg. 1's eager loop) both gradient functions return what the allocating
    form returns, call after call, while every large intermediate lives in one kept buffer."""
    from pwan_ros.core.pwan.potential import Workspace

    torch.manual_seed(3)
    net = _net(3, (16, 16))
    weights = net.weights()
    work = Workspace()
    tangents = tangent_rows(16, 3, torch.float32, 'cpu')
    coef = torch.tensor([1.2, -0.3])
    seen = None
    for _ in range(3):
        xb = torch.randn(1, 40, 3).expand(3, -1, -1)
        zb = torch.randn(3, 30, 3)
        gi = torch.randint(70, (16,))
        args = (weights, net.h, xb, zb, coef, Penalty(gi, tangents, 10.0), 'learn')
        torch.testing.assert_close(
            potential_grads(*args, work=work), potential_grads(*args), rtol=0, atol=0
        )
        torch.testing.assert_close(
            transform_input_grad(weights, net.h, zb, work=work),
            transform_input_grad(weights, net.h, zb),
            rtol=0,
            atol=0,
        )
        ptrs = {k: v.data_ptr() for k, v in work._bufs.items()}
        assert seen is None or ptrs == seen  # the same buffers every call: nothing allocated
        seen = ptrs
    assert len(seen) > 20


def test_member_state_is_a_potentialnet_with_identical_values():
    net = _net(3)
    x = torch.randn(3, 50, 3)
    g = net(x)
    for i in range(3):
        single = PotentialNet(3, PotentialConfig(hidden=(32, 32)))
        single.load_state_dict(net.state(i))
        torch.testing.assert_close(single.raw(x[i]), g[i], rtol=1e-5, atol=1e-6)
    net.load_state(1, single.state())  # and back: member 1 becomes that network
    torch.testing.assert_close(net(x)[1], single.raw(x[1]), rtol=1e-5, atol=1e-6)


def test_transform_matches_rotation_convention():
    rots = [rot3(30, 0, 0), rot3(0, -45, 10)]
    tr = BatchedTransform('rigid', rots, torch.float64)
    y = torch.randn(2, 20, 3, dtype=torch.float64)
    z = tr(y)
    for i, r in enumerate(rots):
        np.testing.assert_allclose(z[i].detach().numpy(), y[i].numpy() @ r.T, atol=1e-10)


def test_fused_adam_is_torch_adam():
    p = torch.randn(20)
    q = torch.nn.Parameter(p.clone())
    ref = torch.optim.Adam([q], lr=1e-2, betas=(0.5, 0.99))
    mine = FusedAdam([p], 1e-2, (0.5, 0.99))
    for _ in range(6):
        g = torch.randn(20)
        q.grad = g.clone()
        ref.step()
        mine.step([g])
    torch.testing.assert_close(p, q.detach(), rtol=1e-6, atol=1e-7)


def _sets(rot, n=300):
    """Normalised like register() does (centroids aligned, unit RMS)."""
    src = blob(n, 1)
    ref = blob(n, 0) @ rot.T + np.array([0.1, -0.05, 0.0])
    norm = make_normaliser(src, ref, align_centroids=True)
    return norm.source(src), norm.reference(ref)


def _problem(ys, xs):
    """Alg. 1's problem of the sets, matching 0.8 of the source (mass type), on the CPU."""
    return SampledProblem(ys, xs, 0.8 * len(ys), float(len(xs)), None, 0.0, torch.device('cpu'))


@pytest.mark.parametrize('kind,batch', [('affine', 0), ('nonrigid', 0), ('nonrigid', 64)])
def test_linear_transform_gradients_equal_autograd(kind, batch):
    """The affine / non-rigid step's written-out gradients (incl. the coherence term and the
    natural-gradient metric, mini-batch rows with repeats) are autograd's of
    sum(z * dz) + C(V) / r."""
    ys, xs = _sets(rot3(20, 0, 0), n=200)
    cfg = RegistrationConfig(transform=kind, batch_size=batch).pinned().resolved()
    coh = None
    if kind == 'nonrigid':
        coh = Coherence(
            torch.as_tensor(ys, dtype=torch.float32),
            cfg.coherence,
            torch.Generator().manual_seed(0),
        )
    run = Alg1(cfg, _problem(ys, xs), Starts([rot3(5, 0, 0)]), 0, coherence=coh)
    with torch.no_grad():
        for p in run.t_params:
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    r = run.y.shape[0]
    yi = (
        None
        if not batch
        else torch.randint(r, (batch,), generator=torch.Generator().manual_seed(2))
    )
    ysrc = (run.y if yi is None else run.y[yi])[None]
    dz = torch.randn(ysrc.shape, generator=torch.Generator().manual_seed(3))
    z = run.transform.apply(ysrc, run.transform.linear(), yi)
    loss = (z * dz).sum()
    if coh is not None:
        loss = loss + coh.value(run.transform.v[0]) / r
    ref = list(torch.autograd.grad(loss, run.t_params))
    if coh is not None:
        ref[-1] = coh.apply_kernel(ref[-1][0])[None] * r
    got = run.linear_grads(ysrc, dz, yi)
    assert len(got) == len(ref)
    for g, e in zip(got, ref):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('steps', [2, 7, 30, 45])
def test_window_replays_run_the_same_steps(monkeypatch, steps):
    """The CUDA-graph loop of run_alg1 (first step launched, then one captured step replayed to
    each window's end, convergence read between windows), with a 'graph' that replays its step
    eagerly on the CPU: the same steps in the same order, so bit-identical to the plain loop, for
    runs shorter than a window, ending on a window and ending mid-window."""
    from pwan_ros.core.pwan import acceleration, alg1

    class EagerWindow:
        built = 0

        def __init__(self, run, steps=1):
            self.run, self.steps = run, steps
            EagerWindow.built += 1

        def replay(self, times=1):
            for _ in range(times * self.steps):
                self.run.step()

    ys, xs = _sets(rot3(20, 0, 0))
    cfg = RegistrationConfig(warmup_updates=10, min_steps=0, window=10).resolved()
    args = (cfg, _problem(ys, xs), Starts([np.eye(3), rot3(40, 0, 0)]), Schedule(steps, seed=2))
    plain = run_alg1(*args)
    monkeypatch.setattr(alg1, 'graphs_wanted', lambda config, device: True)
    monkeypatch.setattr(acceleration, 'WindowGraph', EagerWindow)
    windows = run_alg1(*args)
    assert EagerWindow.built == 1
    assert windows.steps == plain.steps and windows.updates == plain.updates
    for p, w in zip(plain.starts, windows.starts):
        np.testing.assert_array_equal(p.a, w.a)
        np.testing.assert_array_equal(p.t, w.t)
        assert p.converged == w.converged


def test_starts_do_not_interact():
    """Start 0 follows the same path whatever the other starts do (sum of independent objectives,
    element-wise Adam)."""
    ys, xs = _sets(rot3(20, 0, 0))
    cfg = RegistrationConfig(warmup_updates=20).resolved()
    a = run_alg1(cfg, _problem(ys, xs), Starts([np.eye(3), rot3(90, 0, 0)]), Schedule(15, 4))
    b = run_alg1(cfg, _problem(ys, xs), Starts([np.eye(3), rot3(0, 120, 0)]), Schedule(15, 4))
    np.testing.assert_allclose(a.starts[0].a, b.starts[0].a, atol=1e-5)
    np.testing.assert_allclose(a.starts[0].t, b.starts[0].t, atol=1e-5)
    assert not np.allclose(a.starts[1].a, b.starts[1].a, atol=1e-2)


@pytest.mark.parametrize('fn', ['potential', 'transform'])
def test_gradient_functions_compile_whole(fn):
    """torch.compile(fullgraph=True) captures each gradient function in one graph on CPU (a graph
    break raises): what compile=on needs. The eager backend checks the capture without paying
    for code generation; the result equals the plain call."""
    torch._dynamo.reset()
    net = _net(2)
    xb = torch.randn(1, 64, 3).expand(2, -1, -1)
    zb = torch.randn(2, 64, 3)
    if fn == 'potential':
        penalty = Penalty(torch.randint(128, (8,)), tangent_rows(8, 3, torch.float32, 'cpu'), 10.0)
        args = (net.weights(), net.h, xb, zb, torch.tensor([1.0, -0.2]), penalty, 'learn')
        f = potential_grads
    else:
        args = (net.weights(), net.h, zb)
        f = transform_input_grad
    with torch.no_grad():
        got = torch.compile(f, fullgraph=True, backend='eager')(*args)
        torch.testing.assert_close(got, f(*args))


@pytest.mark.heavy
def test_compiled_step_past_the_recompile_limit_runs_eager(monkeypatch):
    """More input shape sets in one process than torch.compile may build graphs for (dynamo's
    limit fails a fullgraph call, seen on a GPU): the registration still runs, eager, with one
    warning, and solves the pose."""
    import pwan_ros.core.pwan.acceleration as acceleration

    torch._dynamo.reset()
    monkeypatch.setattr(acceleration, 'MAX_GRAPHS', 1)
    # not monkeypatch: its undo of a torch config entry deletes it (the next Compiled then fails
    # with AttributeError), so the limit is set and restored by hand
    limit = torch._dynamo.config.recompile_limit
    torch._dynamo.config.recompile_limit = 1
    try:
        _run_past_the_limit(monkeypatch)
    finally:
        torch._dynamo.config.recompile_limit = limit
        torch._dynamo.reset()


def _run_past_the_limit(monkeypatch):
    from pwan_ros.core import register
    from pwan_ros.core.pwan import acceleration, alg1

    made = {}
    fns = {'potential_grads': potential_grads, 'transform_input_grad': transform_input_grad}
    monkeypatch.setattr(
        alg1,
        'compiled',
        lambda name, mode: made.setdefault(
            name, acceleration.Compiled(fns[name], mode, backend='eager')
        ),
    )
    rot = rot3(25, -10, 15)
    t = np.array([3.0, -2.0, 1.0])  # metres
    caught = []
    for n in (400, 300, 250):
        src = blob(n, 1) * 10.0
        ref = blob(n, 0) * 10.0 @ rot.T + t
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter('always')
            res = register(src, ref, RegistrationConfig(seed=0, compile='on'))
        caught += [str(x.message) for x in w if 'runs eager' in str(x.message)]
        cos = (np.trace(res.transform[:3, :3] @ rot.T) - 1) / 2
        assert np.degrees(np.arccos(np.clip(cos, -1, 1))) < 1.0
        assert np.linalg.norm(res.transform[:3, 3] - t) < 0.1
    assert made and all(c.failed for c in made.values())
    assert 1 <= len(caught) <= len(made)


@pytest.mark.slow
def test_register_with_the_compiled_step_on_cpu():
    """compile='on' on CPU (inductor code generation, tens of seconds): the registration runs the
    compiled gradient functions and solves what the eager one solves, to the same pose."""
    from pwan_ros.core import register

    torch._dynamo.reset()
    rot = rot3(25, -10, 15)
    src = blob(800, 1)
    ref = blob(800, 0) @ rot.T + np.array([0.3, -0.2, 0.1])
    eager = register(src, ref, RegistrationConfig(seed=0, compile='off'))
    comp = register(src, ref, RegistrationConfig(seed=0, compile='on'))
    for res in (eager, comp):
        assert (
            np.degrees(
                np.arccos(np.clip((np.trace(res.transform[:3, :3] @ rot.T) - 1) / 2, -1, 1))
            )
            < 1.0
        )
    np.testing.assert_allclose(comp.transform, eager.transform, atol=2e-3)


def test_compile_auto_is_off_on_every_device():
    """``compile='auto'`` builds no torch.compile graphs on CUDA either (on an H200 the CUDA graphs
    of eager steps ran as fast, and the compile cost 17-42 s per shape set); 'on' still does."""
    from pwan_ros.core.pwan.acceleration import compile_wanted

    for dev in ('cpu', 'cuda'):
        assert not compile_wanted(RegistrationConfig(device=dev))
        assert not compile_wanted(RegistrationConfig(compile='off', device=dev))
        assert compile_wanted(RegistrationConfig(compile='on', device=dev))
