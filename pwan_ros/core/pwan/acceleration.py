"""How Alg. 1 runs fast on its device (:mod:`alg1`): Adam as one fused kernel call per step
(:class:`FusedAdam`), ``torch.compile`` of the two gradient functions of :mod:`gradients`
(:class:`Compiled`, the ``compile`` setting) and, on CUDA, one step captured as a CUDA graph and
replayed (:class:`WindowGraph`, the ``cuda_graphs`` setting). Each falls back to the eager path
with one warning per process where this torch or driver cannot do it."""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, Optional, Sequence

import torch

from ..config import RegistrationConfig
from .gradients import potential_grads, transform_input_grad
from .potential import Workspace

__all__ = [
    'MAX_GRAPHS',
    'Compiled',
    'FusedAdam',
    'WindowGraph',
    'compile_wanted',
    'compiled',
    'graphs_wanted',
    'window_graph',
]


#: graphs ``torch.compile`` may build per gradient function in one process (one per input shape
#: set: tournament / finalists / single start, 2-D / 3-D, with and without the penalty rows). Past
#: it, new shape sets run eager; dynamo's own limit (8) would otherwise fail a fullgraph call.
MAX_GRAPHS = 64


def _compile_errors() -> tuple:
    """dynamo's errors that make a call run eager. Imported by :class:`Compiled` only: importing
    torch._dynamo costs a process 1.4 s of CPU, and compile is off unless asked for."""
    import torch._dynamo.exc as exc

    names = ('TorchDynamoException', 'FailOnRecompileLimitHit')
    return tuple(getattr(exc, n) for n in names if hasattr(exc, n))


class Compiled:
    """``torch.compile(fn, fullgraph=True, mode=mode, dynamic=False)`` of :func:`potential_grads`
    or :func:`transform_input_grad`, made once per process (:func:`compiled`), so later
    registrations of the same shapes reuse its graphs. A call that dynamo cannot compile (past
    :data:`MAX_GRAPHS` shape sets, or an unsupported construct in a future torch) runs the eager
    function instead, with one warning per process: a registration never fails for the compile."""

    def __init__(self, fn: Callable, mode: Optional[str], backend: str = 'inductor'):
        import torch._dynamo

        cfg = torch._dynamo.config
        cfg.recompile_limit = max(cfg.recompile_limit, MAX_GRAPHS)
        cfg.accumulated_recompile_limit = max(cfg.accumulated_recompile_limit, 4 * MAX_GRAPHS)
        self.fn, self.eager_work = fn, Workspace()
        self.graph = torch.compile(fn, fullgraph=True, mode=mode, dynamic=False, backend=backend)
        self.failed, self.errors = False, _compile_errors()

    def __call__(self, *args, **kwargs):
        if not self.failed:
            try:
                return self.graph(*args, **kwargs)
            except self.errors as e:  # not compilable: run eager
                self.failed = True
                warnings.warn(
                    f'torch.compile of {self.fn.__name__} failed ({type(e).__name__}); '
                    'Alg. 1 runs eager in this process',
                    RuntimeWarning,
                    stacklevel=2,
                )
        return self.fn(*args, work=self.eager_work, **kwargs)


@functools.lru_cache(maxsize=None)
def compiled(fn_name: str, mode: Optional[str]) -> Compiled:
    """The process's :class:`Compiled` :func:`potential_grads` or :func:`transform_input_grad`."""
    fn = {'potential_grads': potential_grads, 'transform_input_grad': transform_input_grad}[
        fn_name
    ]
    return Compiled(fn, mode)


class FusedAdam:
    """Adam (no weight decay) over a few tensors with one call of the fused kernel per step: the
    kernel ``torch.optim.Adam(fused=True)`` runs (``torch._fused_adam_``), without that class's
    per-step Python bookkeeping, which costs 30x the kernel on these small tensors. The learning
    rate is a tensor (``lr``, change it in place): nothing in a step reads the host."""

    def __init__(
        self, params: Sequence[torch.Tensor], lr: float, betas=(0.9, 0.999), eps: float = 1e-8
    ):
        self.params = list(params)
        dev = self.params[0].device
        self.lr = torch.tensor(float(lr), dtype=torch.float32, device=dev)
        self.betas, self.eps = (float(betas[0]), float(betas[1])), float(eps)
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]
        self.steps = [torch.zeros((), dtype=torch.float32, device=dev) for _ in self.params]

    def step(self, grads: Sequence[torch.Tensor]) -> None:
        """One descent step with ``grads`` (one per parameter, same shapes)."""
        torch._foreach_add_(self.steps, 1.0)
        torch._fused_adam_(
            self.params,
            list(grads),
            self.exp_avg,
            self.exp_avg_sq,
            [],
            self.steps,
            lr=self.lr,
            beta1=self.betas[0],
            beta2=self.betas[1],
            weight_decay=0.0,
            eps=self.eps,
            amsgrad=False,
            maximize=False,
        )


class WindowGraph:
    """``steps`` consecutive :meth:`alg1.Alg1.step` calls of ``run`` (an :class:`alg1.Alg1`; not
    imported here: alg1 imports this module) captured as one CUDA graph: a replay runs
    them with no host work between kernels (a step is tens of small kernels per potential update;
    launched one by one from Python, their launch cost was most of a single start's step on an
    H200). Everything a step reads or writes lives in tensors that outlive the graph (network,
    transform, optimiser states, learning-rate table and index), its random draws come from the
    run's device generator (registered with the graph, so every replay draws new indices), and it
    reads nothing on the host. Built after the run's first step ran eagerly (cuBLAS handles,
    compiled kernels and buffers exist by then); capture does not execute the steps,
    :meth:`replay` does. One step is captured and replayed as often as a window needs: a graph's
    capture and first upload grow with its kernels and are paid by every registration (one
    non-rigid step: 20-30 ms on an H200)."""

    def __init__(self, run: Any, steps: int = 1):
        self.graph = torch.cuda.CUDAGraph()
        self.graph.register_generator_state(run.gen)
        torch.cuda.synchronize(run.device)
        # thread_local: CUDA work of the caller's other threads (another model, say) during the
        # capture neither breaks it nor is captured
        with torch.cuda.graph(self.graph, capture_error_mode='thread_local'):
            for _ in range(steps):
                run.step()
        self.steps = steps

    def replay(self, times: int = 1) -> None:
        """Run the captured steps ``times`` times (``times`` x ``steps`` steps), no host read."""
        for _ in range(times):
            self.graph.replay()


def graphs_wanted(config: RegistrationConfig, device: torch.device) -> bool:
    """``config.cuda_graphs`` on a CUDA device."""
    return device.type == 'cuda' and config.cuda_graphs


def window_graph(run: Any) -> Optional[WindowGraph]:
    """A :class:`WindowGraph` of ``run``, or None (with one warning per process) when this torch
    or driver cannot capture it: the run goes on launching each step."""
    global _GRAPH_FAILED
    if _GRAPH_FAILED:
        return None
    try:
        return WindowGraph(run)
    except (RuntimeError, AttributeError) as e:  # capture unsupported here: steps run eagerly
        _GRAPH_FAILED = True
        warnings.warn(
            f'CUDA graph capture of Alg. 1 failed ({type(e).__name__}: {e}); steps are launched '
            'one by one in this process',
            RuntimeWarning,
            stacklevel=2,
        )
        return None


_GRAPH_FAILED = False


def compile_wanted(config: RegistrationConfig) -> bool:
    """``config.compile``: 'on'; 'off' or 'auto' = off on every device: on the CPU the compile
    pays back only after ~40 registrations of one shape set, and on CUDA the windows of eager
    steps replayed as CUDA graphs ran as fast as compiled ones (H200, docs/benchmarks.md) without
    a 17-42 s graph build per shape set."""
    return config.compile == 'on'
