"""PWAN trainer for partial domain adaptation (paper Sec. 5, eq. obj_PDA). Pure PyTorch.

One training step on a labelled batch (x, l) (stratified: equally many rows per class) and an
unlabelled batch y:

  for u times:  w <- RMSprop ascent of  m_alpha * mean f_w(T^(x)) - mean f_w(T(y)) - gp * GP(f_w)
  theta, nu <- Adam descent of
      mean_i mu_{l_i} CE(eta(x_i), l_i) + lambda1 * (-mean f_w(T(y))) + lambda2 * H(eta(y))

T^ is the frozen bottleneck (no gradient through the labelled side of the alignment term).
mu_l = K * (mean softmax probability of class l on the unlabelled rows; the paper's hard
indicator with ``soft_weights=False``), re-estimated every ``weight_interval`` steps.
m_alpha = m0 * s^step with m0 = K / |{l : fraction of argmax predictions in l > 1 / K}|
(estimated once, when alignment starts) unless given, and s = 10^(1/steps) unless given.
The first ``warmup_steps`` steps are plain cross-entropy; alignment, entropy, mu and m0 start
after them. source_only and wgan (complete alignment) are the same trainer with fixed settings
(:meth:`AdaptConfig.resolved_method`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import numpy as np
import torch
from torch import nn

from .config import AdaptConfig
from .data import FeatureSet, check_pair
from .errors import AdaptConfigError, AdaptInputError
from .models import AdaptedClassifier, PotentialNet, gradient_penalty

# 2: tensors and plain values only (torch.load(weights_only=True)); 3: norm.scale, holdout;
# 4: the selected snapshot (weights) and its label-free criteria, the source-only side models
# 5: Adam with two parameter groups (the first bottleneck layer's own learning rate)
CHECKPOINT_VERSION = 6  # 6: the data's fingerprint
# Config fields that may differ between a checkpoint and the run that resumes it.
RESUME_FREE = (
    'steps',
    'device',
    'threads',
    'plots',
    'eval_batch',
    'eval_interval',
    'checkpoint_interval',
    'memory_limit_mb',
    'safeguard_margin',
    'min_agreement',
    'check_alpha',
)


def resolve_device(name: str) -> torch.device:
    """'auto' -> CUDA when available else CPU; 'cuda' without CUDA is an error."""
    name = name.strip().lower()
    if name == 'auto':
        return torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    if name.startswith('cuda') and not torch.cuda.is_available():
        raise AdaptConfigError(f"device '{name}' requested but CUDA is not available")
    return torch.device(name)


@dataclass
class StepMetrics:
    """Scalars of one training step (losses are batch means)."""

    step: int
    lr: float
    m_alpha: float
    loss: float
    ce: float
    w1: float  # m_alpha * mean f(T^(x)) - mean f(T(y)): the partial-W1 estimate (0 when off)
    gp: float
    entropy: float


@dataclass
class UnlabelledPass:
    """A full pass over the unlabelled rows: predictions (M,) int64 and summary statistics."""

    step: int
    predictions: np.ndarray
    mean_entropy: float
    class_fraction: np.ndarray  # (K,) fraction of rows predicted as each class
    accuracy: Optional[float] = None
    absent_fraction: Optional[float] = None  # fraction predicted in classes absent from the truth


@dataclass
class TrainerState:
    """Everything besides network/optimiser weights that a checkpoint restores."""

    step: int = 0
    mu: Optional[np.ndarray] = None  # (K,) class weights, mean 1
    m0: float = 1.0
    best_entropy: float = math.inf  # mean entropy of the selected snapshot
    best_step: int = -1  # step of the selected snapshot (-1: none yet)
    # selection score of that snapshot (the selector's ``prefers`` compares two)
    best_score: List[float] = field(default_factory=list)
    best_criteria: Dict[str, Optional[float]] = field(default_factory=dict)
    history: List[Dict[str, float]] = field(default_factory=list)
    evals: List[Dict[str, float]] = field(default_factory=list)
    train_seconds: float = 0.0


def fingerprint(labelled: FeatureSet, unlabelled: FeatureSet, chunk: int = 4096) -> str:
    """SHA-256 (hex) of both sets' features as float32 and their labels, streamed in blocks: a
    resume on other files of the same shape (a rescaled copy) is refused, not re-decided."""
    h = hashlib.sha256()
    for fs in (labelled, unlabelled):
        for block in fs.batches(chunk):
            h.update(np.ascontiguousarray(block).tobytes())
        h.update(b'|' if fs.labels is None else np.asarray(fs.labels, np.int64).tobytes())
    return h.hexdigest()


class AdaptTrainer:
    """Trains eta = D_nu o T_theta on a labelled and an unlabelled :class:`FeatureSet`.

    Args:
        config: validated :class:`AdaptConfig` (the method's fixed settings are applied here).
        labelled: features (N, D) with labels (N,) in 0..K-1.
        unlabelled: features (M, D); labels, if present, are read only by :meth:`evaluate`.
        holdout: labelled row indices never trained on (the safeguard's validation rows); the
            input normalisation is still fitted on all labelled rows (it uses no labels).

    Snapshot selection: at every evaluation (``eval_interval``) the current weights are scored by
    ``selector(trainer, pass) -> (score, criteria) | None`` (None: not eligible; default: the
    lowest mean entropy after warm-up); a new score replaces the kept one when
    ``selector.prefers(new, kept)`` (default: larger as a tuple) and the kept weights are in
    :attr:`snapshot` (and in checkpoints); :meth:`restore_snapshot` loads them.
    """

    #: label-free snapshot scorer (see the class docstring); set before :meth:`train`
    selector: Optional[Callable[['AdaptTrainer', 'UnlabelledPass'], Optional[tuple]]] = None
    #: source-only models trained step by step beside this one (:meth:`attach_companions`):
    #: ``companion`` without the holdout rows (the safeguard's reference), ``fallback`` on all
    #: labelled rows (what the safeguard deploys when the adapted model fails)
    companion: Optional['AdaptTrainer'] = None
    fallback: Optional['AdaptTrainer'] = None

    def __init__(
        self,
        config: AdaptConfig,
        labelled: FeatureSet,
        unlabelled: FeatureSet,
        holdout: Optional[np.ndarray] = None,
    ):
        self.user_config = config
        self.config = cfg = config.resolved_method()
        self.labelled, self.unlabelled = labelled, unlabelled
        self.num_classes = check_pair(labelled, unlabelled)
        self._fingerprint: Optional[str] = None  # of the data, on the first checkpoint
        self.device = resolve_device(cfg.device)
        k = self.num_classes
        torch.manual_seed(cfg.seed)
        self.model = AdaptedClassifier(
            labelled.dim, k, cfg.bottleneck_dim, cfg.dropout, cfg.input_norm
        )
        if cfg.input_norm not in ('none', 'l2'):
            mean, scale = fit_input_norm(labelled, cfg.input_norm, cfg.eval_batch)
            self.model.norm.mean.copy_(torch.from_numpy(mean))
            self.model.norm.scale.copy_(torch.from_numpy(scale))
        self.potential = PotentialNet(
            cfg.bottleneck_dim, cfg.potential_hidden, nonpositive=cfg.method != 'wgan'
        )
        self.model.to(self.device)
        self.potential.to(self.device)
        self.first_layer_lr = cfg.lr * first_layer_lr_factor(
            self.model.norm, labelled, cfg.lr_l1_reference, cfg.eval_batch
        )
        first = self.model.bottleneck[0].weight
        rest = [p for p in self.model.parameters() if p is not first]
        self.opt = torch.optim.Adam(
            [{'params': rest}, {'params': [first], 'lr': self.first_layer_lr}],
            lr=cfg.lr,
            weight_decay=cfg.weight_decay,
        )
        self.opt_w = torch.optim.RMSprop(self.potential.parameters(), lr=cfg.potential_lr)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, self._lr_factor)
        self.rng = np.random.default_rng(cfg.seed)
        self.gen = torch.Generator().manual_seed(cfg.seed + 1)
        train = np.ones(labelled.n, bool)
        if holdout is not None:
            train[np.asarray(holdout, dtype=np.int64)] = False
        self._train_rows = train
        self._side_rng: Dict[str, tuple] = {}
        self.by_class = [np.flatnonzero((labelled.labels == c) & train) for c in range(k)]
        self.per_class = max(1, cfg.batch_size // k)
        self.state = TrainerState(mu=np.ones(k), m0=cfg.m0 if cfg.m0 >= 1 else 1.0)
        self.snapshot: Optional[Dict[str, torch.Tensor]] = None  # weights at state.best_step

    def attach_companions(self) -> None:
        """Make :attr:`companion` and :attr:`fallback`: the same config with
        ``method=source_only``, without this trainer's holdout rows and on all labelled rows. Each
        is trained one step after each of this trainer's steps by :meth:`train` and saved in the
        same checkpoints, so an interrupted run resumes all three; each draws from its own torch
        generator state, so this trainer's steps are the same with or without them, and
        ``fallback`` is the model a plain ``method=source_only`` run trains."""
        holdout = np.flatnonzero(~self._train_rows)
        self.companion, self._side_rng['companion'] = self._side_model(holdout)
        self.fallback, self._side_rng['fallback'] = self._side_model(None)

    def _cuda_devices(self) -> List[int]:
        """The CUDA devices whose generators ``torch.random.fork_rng`` must fork."""
        return [self.device.index or 0] if self.device.type == 'cuda' else []

    def _side_model(self, holdout):
        with torch.random.fork_rng(devices=self._cuda_devices()):
            tr = AdaptTrainer(
                dataclasses.replace(self.user_config, method='source_only'),
                self.labelled,
                self.unlabelled,
                holdout,
            )
            tr._fingerprint = self._data()['fingerprint']  # the same files: hashed once
            return tr, self._rng_state()

    def _sides(self):
        return [
            (n, t) for n, t in (('companion', self.companion), ('fallback', self.fallback)) if t
        ]

    def _rng_state(self):
        cuda = torch.cuda.get_rng_state(self.device) if self.device.type == 'cuda' else None
        return torch.get_rng_state(), cuda

    def _side_steps(self) -> None:
        for name, tr in self._sides():
            with torch.random.fork_rng(devices=self._cuda_devices()):
                cpu_state, cuda_state = self._side_rng[name]
                torch.set_rng_state(cpu_state)
                if cuda_state is not None:
                    torch.cuda.set_rng_state(cuda_state, self.device)
                tr.step()
                self._side_rng[name] = self._rng_state()

    # ------------------------------------------------------------------ schedules
    def _lr_factor(self, step: int) -> float:
        return (1.0 + 10.0 * step / self.config.steps) ** -0.75

    def m_alpha(self, step: Optional[int] = None) -> float:
        """m_alpha = m0 * s^step, capped at ``max_m_alpha`` (1 for wgan); s = 10^(1/steps) when
        ``anneal`` is 0 (the paper's choice of m_alpha = 10 m0 at the last step)."""
        step = self.state.step if step is None else step
        cfg = self.config
        s = cfg.anneal if cfg.anneal > 0 else 10.0 ** (1.0 / cfg.steps)
        return float(min(cfg.max_m_alpha, self.state.m0 * s**step))

    @property
    def aligning(self) -> bool:
        return self.state.step >= self.config.warmup_steps

    # ------------------------------------------------------------------ one step
    def _batch(self):
        x_idx = np.concatenate(
            [idx[self.rng.integers(0, idx.size, self.per_class)] for idx in self.by_class]
        )
        y_idx = np.sort(self.rng.integers(0, self.unlabelled.n, self.config.batch_size))
        x = torch.from_numpy(self.labelled.rows(x_idx)).to(self.device)
        lab = torch.from_numpy(self.labelled.labels[x_idx]).to(self.device)
        y = torch.from_numpy(self.unlabelled.rows(y_idx)).to(self.device)
        return x, lab, y

    def step(self) -> StepMetrics:
        """One training step (see module docstring); returns its metrics."""
        cfg, st = self.config, self.state
        needs_weights = cfg.reweight or (cfg.lambda1 > 0 and cfg.m0 == 0.0)
        if (
            needs_weights
            and self.aligning
            and (st.step - cfg.warmup_steps) % cfg.weight_interval == 0
        ):
            self._update_weights()
        x, lab, y = self._batch()
        self.model.train()
        m_alpha = self.m_alpha()
        align = self.aligning and cfg.lambda1 > 0
        zx = self.model.embed(x)
        zy = self.model.embed(y)
        w1 = gp = 0.0
        if align:
            zx_d, zy_d = zx.detach(), zy.detach()
            for _ in range(cfg.potential_updates):
                penalty = gradient_penalty(self.potential, zx_d, zy_d, self.gen)
                gain = m_alpha * self.potential(zx_d).mean() - self.potential(zy_d).mean()
                self.opt_w.zero_grad(set_to_none=True)
                (-(gain - cfg.gp_weight * penalty)).backward()
                self.opt_w.step()
            w1, gp = float(gain.detach()), float(penalty.detach())
        weights = torch.as_tensor(
            st.mu if (cfg.reweight and self.aligning) else np.ones(self.num_classes),
            dtype=torch.float32,
            device=self.device,
        )
        ce = (
            nn.functional.cross_entropy(self.model.head(zx), lab, reduction='none') * weights[lab]
        ).mean()
        loss = ce
        logits_y = self.model.head(zy)
        p = logits_y.softmax(dim=1)
        ent = -(p * logits_y.log_softmax(dim=1)).sum(dim=1).mean()
        if align:
            for prm in self.potential.parameters():
                prm.requires_grad_(False)
            loss = loss + cfg.lambda1 * (-self.potential(zy).mean())
            for prm in self.potential.parameters():
                prm.requires_grad_(True)
        if self.aligning and cfg.lambda2 > 0:
            loss = loss + cfg.lambda2 * ent
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        lr = self.opt.param_groups[0]['lr']
        self.sched.step()
        metrics = StepMetrics(
            st.step,
            lr,
            m_alpha,
            float(loss.detach()),
            float(ce.detach()),
            w1,
            gp,
            float(ent.detach()),
        )
        st.history.append(dataclasses.asdict(metrics))
        st.step += 1
        return metrics

    def _update_weights(self) -> None:
        """Re-estimate mu (and m0 unless given) from predictions on the unlabelled rows."""
        k = self.num_classes
        soft, hard = self.class_fractions()
        self.state.mu = (soft if self.config.soft_weights else hard) * k
        if self.config.m0 == 0.0 and self.state.step == self.config.warmup_steps:
            # m0 is estimated once, from the hard predictions of the warmed-up classifier (a soft
            # average of a young classifier is too flat to count classes); later estimates would
            # feed back on the alignment they drive.
            present = int((hard > 1.0 / k).sum())
            self.state.m0 = k / max(1, present)

    # ------------------------------------------------------------------ inference
    @torch.no_grad()
    def embed(self, features: FeatureSet, index: np.ndarray) -> np.ndarray:
        """Bottleneck features (k, B) of rows ``index``."""
        self.model.eval()
        return (
            self.model.embed(torch.from_numpy(features.rows(index)).to(self.device)).cpu().numpy()
        )

    def class_fractions(self):
        """Predicted class distributions (K,) on the unlabelled rows: (mean softmax, fraction of
        argmax predictions)."""
        soft = torch.zeros(self.num_classes, dtype=torch.float64)
        hard = torch.zeros(self.num_classes, dtype=torch.float64)
        self.model.eval()
        with torch.no_grad():
            for b in self.unlabelled.batches(self.config.eval_batch):
                logits = self.model(torch.from_numpy(b).to(self.device)).cpu()
                soft += logits.softmax(dim=1).sum(0).double()
                hard += torch.bincount(logits.argmax(dim=1), minlength=self.num_classes).double()
        return (soft / self.unlabelled.n).numpy(), (hard / self.unlabelled.n).numpy()

    def evaluate(self) -> UnlabelledPass:
        """Predict every unlabelled row; accuracy and absent-class rate when labels exist."""
        return unlabelled_pass(
            self.model,
            self.unlabelled,
            self.device,
            self.config.eval_batch,
            self.num_classes,
            self.state.step,
        )

    def record_eval(self, res: UnlabelledPass) -> bool:
        """Append an evaluation to the history and score the current weights as a snapshot; True
        when they are the new selected snapshot (higher score; unsupervised criteria only)."""
        row = {'step': res.step, 'mean_entropy': res.mean_entropy, 'm_alpha': self.m_alpha()}
        if res.accuracy is not None:
            row.update(accuracy=res.accuracy, absent_fraction=res.absent_fraction)
        if self.selector is not None:
            judged = self.selector(self, res)
        elif res.step >= self.config.warmup_steps:
            judged = ((-res.mean_entropy,), {'mean_entropy': res.mean_entropy})
        else:
            judged = None
        row['eligible'] = judged is not None
        self.state.evals.append(row)
        if judged is None:
            return False
        score, criteria = [float(v) for v in judged[0]], dict(judged[1])
        st = self.state
        prefers = getattr(self.selector, 'prefers', None) or (lambda a, b: tuple(a) > tuple(b))
        if st.best_step >= 0 and not prefers(score, st.best_score):
            return False
        st.best_entropy, st.best_step = res.mean_entropy, res.step
        st.best_score, st.best_criteria = score, criteria
        self.snapshot = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        return True

    def restore_snapshot(self) -> bool:
        """Load the selected snapshot's weights into :attr:`model` (after training: what the
        safeguard deploys); False when there is none."""
        if self.snapshot is None:
            return False
        self.model.load_state_dict(self.snapshot)
        return True

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """Everything needed to continue bit-exactly: weights, optimisers, scheduler, RNGs, mu,
        m0."""
        st = self.state
        return {
            'version': CHECKPOINT_VERSION,
            'config': self.user_config.to_dict(),
            'data': self._data(),
            'model': self.model.state_dict(),
            'snapshot': self.snapshot,
            'potential': self.potential.state_dict(),
            'opt': self.opt.state_dict(),
            'opt_w': self.opt_w.state_dict(),
            'sched': self.sched.state_dict(),
            'rng_numpy': self.rng.bit_generator.state,
            'rng_gen': self.gen.get_state(),
            'rng_torch': torch.get_rng_state(),
            'rng_cuda': torch.cuda.get_rng_state_all() if self.device.type == 'cuda' else None,
            'state': {
                **dataclasses.asdict(st),
                'mu': None
                if st.mu is None
                else torch.from_numpy(np.array(st.mu, dtype=np.float64)),
            },
            'sides': {
                name: {
                    'trainer': tr.state_dict(),
                    'rng_torch': self._side_rng[name][0],
                    'rng_cuda': self._side_rng[name][1],
                }
                for name, tr in self._sides()
            },
        }

    def _data(self) -> dict:
        """What a checkpoint was trained on: the sets' sizes, width, classes and
        :func:`fingerprint` (computed once per trainer; the side models share it)."""
        if self._fingerprint is None:
            self._fingerprint = fingerprint(self.labelled, self.unlabelled)
        return {
            'n_labelled': self.labelled.n,
            'n_unlabelled': self.unlabelled.n,
            'dim': self.labelled.dim,
            'num_classes': self.num_classes,
            'fingerprint': self._fingerprint,
        }

    def load_state_dict(self, ckpt: dict) -> None:
        """Restore a :meth:`state_dict`; the data and training-relevant config must match."""
        if not isinstance(ckpt, dict):
            raise AdaptInputError(f'a checkpoint is a mapping, got {type(ckpt).__name__}')
        if ckpt.get('version') != CHECKPOINT_VERSION:
            raise AdaptInputError(
                f"checkpoint version {ckpt.get('version')} is not {CHECKPOINT_VERSION}"
            )
        data, theirs = self._data(), ckpt.get('data')
        if theirs != data:
            shape = {k: v for k, v in data.items() if k != 'fingerprint'}
            if isinstance(theirs, dict) and all(theirs.get(k) == v for k, v in shape.items()):
                raise AdaptInputError(
                    'checkpoint was trained on other data of the same shape (the features or '
                    'labels differ): resume with the files it was trained on'
                )
            raise AdaptInputError(f'checkpoint was trained on other data ({theirs}), not {shape}')
        if not isinstance(ckpt.get('config'), dict):
            raise AdaptInputError('checkpoint is incomplete or corrupt: no config')
        mine = self.user_config.to_dict()
        diff = sorted(
            k for k, v in ckpt['config'].items() if k not in RESUME_FREE and mine.get(k) != v
        )
        if diff:
            raise AdaptConfigError(
                'cannot resume: the checkpoint was trained with different '
                + ', '.join(f"{k}={ckpt['config'][k]!r} (now {mine[k]!r})" for k in diff)
            )
        sides = ckpt.get('sides')
        if not isinstance(sides, dict) or sorted(sides) != sorted(n for n, _ in self._sides()):
            raise AdaptInputError(
                'checkpoint is incomplete or corrupt: its source-only side models '
                f"{sorted(sides) if isinstance(sides, dict) else sides} are not "
                f'{sorted(n for n, _ in self._sides())}'
            )
        for name, tr in self._sides():  # first: their load sets the global RNGs, this one's last
            tr.load_state_dict(sides[name].get('trainer'))
            try:
                self._side_rng[name] = (sides[name]['rng_torch'], sides[name]['rng_cuda'])
            except (KeyError, TypeError):
                raise AdaptInputError(f'checkpoint is incomplete or corrupt: {name} RNG') from None
        try:
            self.model.load_state_dict(ckpt['model'])
            snap = ckpt['snapshot']
            if snap is not None:
                self.model.load_state_dict(snap)  # checks the keys and shapes
                self.model.load_state_dict(ckpt['model'])
                snap = {k: v.clone() for k, v in snap.items()}
            self.snapshot = snap
            self.potential.load_state_dict(ckpt['potential'])
            self.opt.load_state_dict(ckpt['opt'])
            self.opt_w.load_state_dict(ckpt['opt_w'])
            self.sched.load_state_dict(ckpt['sched'])
            self.rng.bit_generator.state = ckpt['rng_numpy']
            self.gen.set_state(ckpt['rng_gen'])
            torch.set_rng_state(ckpt['rng_torch'])
            if ckpt['rng_cuda'] is not None and self.device.type == 'cuda':
                torch.cuda.set_rng_state_all(ckpt['rng_cuda'])
            s = dict(ckpt['state'])
            mu = s['mu']
            s['mu'] = (
                None
                if mu is None
                else np.asarray(mu.numpy() if torch.is_tensor(mu) else mu, dtype=np.float64)
            )
            self.state = TrainerState(**s)
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise AdaptInputError(
                f'checkpoint is incomplete or corrupt: {type(exc).__name__}: '
                f'{str(exc).splitlines()[0][:160] if str(exc) else ""}'
            ) from None

    # ------------------------------------------------------------------ loop
    def train(
        self,
        until: Optional[int] = None,
        on_step: Optional[Callable[['AdaptTrainer', StepMetrics], None]] = None,
        on_eval: Optional[Callable[['AdaptTrainer', UnlabelledPass, bool], None]] = None,
        on_checkpoint: Optional[Callable[['AdaptTrainer'], None]] = None,
        should_stop: Optional[Callable[[], bool]] = None,
    ) -> bool:
        """Run steps up to ``until`` (default ``config.steps``); True if it got there, False if
        ``should_stop`` interrupted it. Evaluation / checkpoint hooks fire at their intervals."""
        cfg = self.config
        until = cfg.steps if until is None else until
        t0 = time.perf_counter()
        try:
            while self.state.step < until:
                if should_stop is not None and should_stop():
                    return False
                metrics = self.step()
                self._side_steps()
                if on_step is not None:
                    on_step(self, metrics)
                s = self.state.step
                if (on_eval is not None or self.selector is not None) and (
                    s % cfg.eval_interval == 0 or s == cfg.steps
                ):
                    res = self.evaluate()
                    is_best = self.record_eval(res)
                    if on_eval is not None:
                        on_eval(self, res, is_best)
                if (
                    on_checkpoint is not None
                    and s % cfg.checkpoint_interval == 0
                    and s < cfg.steps
                ):
                    on_checkpoint(self)
            return True
        finally:
            self.state.train_seconds += time.perf_counter() - t0


@torch.no_grad()
def unlabelled_pass(
    model: nn.Module, fs: FeatureSet, device, chunk: int, k: int, step: int = 0
) -> UnlabelledPass:
    """``model``'s predictions on every row of ``fs`` (the unlabelled set) in blocks of
    ``chunk``; accuracy and the rate of predictions in classes absent from ``fs`` when it has
    labels."""
    preds, ent_sum = [], 0.0
    model.eval()
    for b in fs.batches(chunk):
        logits = model(torch.from_numpy(b).to(device))
        p = logits.softmax(dim=1)
        ent_sum += float(-(p * logits.log_softmax(dim=1)).sum())
        preds.append(logits.argmax(dim=1).cpu().numpy())
    pred = np.concatenate(preds).astype(np.int64)
    res = UnlabelledPass(
        step, pred, ent_sum / pred.size, np.bincount(pred, minlength=k) / pred.size
    )
    if fs.labels is not None:
        present = np.bincount(fs.labels, minlength=k) > 0
        res.accuracy = float((pred == fs.labels).mean())
        res.absent_fraction = float((~present)[pred].mean())
    return res


@torch.no_grad()
def first_layer_lr_factor(norm, fs: FeatureSet, l1_reference: float, chunk: int) -> float:
    """``min(1, l1_reference / L)``, L = mean L1 norm of the labelled rows after ``norm`` (the
    fitted :class:`~pwan_ros.adaptation.models.InputNorm`); 1 when ``l1_reference`` is 0.

    Adam moves every weight by about the learning rate, with the sign of its gradient; the
    gradient of a first-layer weight is (output gradient) x (input), so one step changes the
    layer's output by up to lr * ||x||_1. On z-scored features ||x||_1 grows with the width D
    (a 4096-d copy of 1024-d features takes 4x larger steps, and the alignment diverges) and on
    unnormalised ones with their scale; the factor keeps the step of the defaults' regime (about
    1024 unit-variance columns) for any feature family. Rows wider or larger than that learn
    slower, narrower ones are left as they are."""
    if l1_reference <= 0:
        return 1.0
    total, n = 0.0, 0
    for b in fs.batches(chunk):
        x = norm(torch.from_numpy(np.ascontiguousarray(b, dtype=np.float32)).to(norm.mean.device))
        total += float(x.abs().sum(dim=1).double().sum())
        n += b.shape[0]
    l1 = total / max(n, 1)
    return 1.0 if l1 <= l1_reference else l1_reference / l1


def fit_input_norm(fs: FeatureSet, mode: str, chunk: int):
    """Standardisation fitted on the labelled rows: ``(mean, scale)`` (D,) float32 for
    ``x -> (x - mean) * scale`` (after per-row L2 normalisation for the ``l2_*`` modes).

    ``zscore``: scale = 1 / column std; a column whose std is below 1e-6 of the largest one
    (constant on the labelled rows) gets scale 0, i.e. it is ignored instead of being divided
    by ~0 and exploding on unlabelled rows where it varies. ``standard``: one common scale for
    all columns, 1 / sqrt(mean column variance), so the features keep their geometry: the result
    is the same (up to rounding) after any rotation, any global scaling and any shift of the
    inputs, also for rotations into more dimensions, and constant columns are harmless. Streaming
    (float64)."""
    l2 = mode.startswith('l2_')
    n, s1, s2 = 0, np.zeros(fs.dim), np.zeros(fs.dim)
    for b in fs.batches(chunk):
        b = b.astype(np.float64)
        if l2:
            b /= np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
        n += b.shape[0]
        s1 += b.sum(0)
        s2 += (b * b).sum(0)
    mean = s1 / n
    var = np.maximum(s2 / n - mean * mean, 0.0)
    std = np.sqrt(var)
    if mode.endswith('zscore'):
        ok = std > 1e-6 * max(float(std.max()), 1e-300)
        scale = np.where(ok, 1.0 / np.where(ok, std, 1.0), 0.0)
    else:
        total = float(var.mean())
        scale = np.full(fs.dim, 1.0 / np.sqrt(total) if total > 0 else 1.0)
    return mean.astype(np.float32), scale.astype(np.float32)
