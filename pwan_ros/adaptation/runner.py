"""End-to-end adaptation run shared by the CLI and the ROS node: inputs -> trainer -> outputs.

Output directory layout (every file written atomically)::

  checkpoints/latest.pt   resumable state (also written on interruption)
  checkpoints/best.pt     the selected snapshot's checkpoint (safeguard: the best-scoring snapshot
                          that passed the label-free tests; off: lowest mean entropy)
  model.ts                TorchScript of the deployed model: features (n, D) -> logits (n, K)
                          (input standardisation + bottleneck + classifier, or one linear
                          layer): one of the candidates, as the safeguard (and the check rows,
                          when given) decided
  candidates/adapted.ts, candidates/source_only.ts, candidates/source_only_linear.ts   the
                          candidates (safeguard on; adapted.ts is the kept snapshot when the final
                          weights pass the label-free tests, else the final weights; the
                          source-only network and logistic regression on all labelled rows)
  predictions.npy         (M,) int64 0-based class ids of the unlabelled rows (deployed model)
  metrics.csv             per-step metrics;  evals.csv: per-evaluation metrics
  metrics.json            both, as lists of records
  plots/*.png             losses, m_alpha, class weights, 2-D projection of bottleneck features
  summary.json            :class:`AdaptResult`
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io as _io
import os
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import numpy as np
import torch

from .config import AdaptConfig
from .data import FeatureSet, check_pair, load_npz
from .errors import AdaptConfigError, AdaptInputError, AdaptOutputError
from pwan_ros.io.atomic import (
    OutputError,
    check_output,
    os_error_text,
    write_bytes,
    write_json,
    write_npy,
    write_text,
)
from .safeguard import (
    Reference,
    SafeguardDecision,
    SnapshotSelector,
    apply_check,
    check_candidates,
    consider_linear,
    decide,
    holdout_split,
    linear_candidate,
)
from .trainer import AdaptTrainer, UnlabelledPass, StepMetrics


@dataclass
class AdaptResult:
    """Summary of a run (``summary.json``). Paths are absolute."""

    completed: bool
    method: str
    steps_done: int
    steps: int
    seed: int
    device: str
    train_seconds: float
    num_classes: int
    class_names: Optional[List[str]]
    n_labelled: int
    n_unlabelled: int
    m0: float
    m_alpha: float
    class_weights: List[float]
    estimated_present_classes: List[int]
    mean_entropy: Optional[float]
    best_step: int
    best_entropy: Optional[float]
    prediction_histogram: Optional[List[int]]
    accuracy: Optional[float]
    absent_class_fraction: Optional[float]
    deployed: Optional[str]  # model in model.ts: adapted | source_only (None: not finished)
    # the source-only model (deployed with source_only): mlp | linear (None: safeguard off)
    source_only_model: Optional[str]
    deployed_reason: Optional[str]
    safeguard: Optional[Dict]  # SafeguardDecision.to_dict(): the criteria of both candidates
    # evaluation labels only: the adapted and the chosen source-only candidate's accuracy
    adapted_accuracy: Optional[float]
    source_only_accuracy: Optional[float]
    output_dir: str
    predictions_path: Optional[str]
    model_path: Optional[str]
    checkpoint_path: str
    best_checkpoint_path: Optional[str]
    summary_path: str

    def to_dict(self) -> Dict:
        return dataclasses.asdict(self)


def load_inputs(labelled_path, unlabelled_path, max_memory_mb: float = 1024.0):
    """Load and validate both feature files (:func:`load_npz`)."""
    lab = load_npz(labelled_path, 'labelled', require_labels=True, max_memory_mb=max_memory_mb)
    try:
        unl = load_npz(unlabelled_path, 'unlabelled', max_memory_mb=max_memory_mb)
    except BaseException:
        lab.close()
        raise
    return lab, unl


def load_checkpoint(path: str) -> dict:
    """Read a checkpoint written by this package. Only tensors and plain values are read
    (``torch.load(weights_only=True)``): a file holding anything else, such as a pickle that would
    run code, is refused with :class:`AdaptInputError`, as is a truncated, empty or foreign
    file."""
    try:
        ckpt = torch.load(path, map_location='cpu', weights_only=True)
    except OSError as exc:
        raise AdaptInputError(f'cannot resume: {os_error_text(exc)}') from None
    except (
        Exception
    ) as exc:  # UnpicklingError (code, foreign types), RuntimeError (not a zip), EOFError
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise AdaptInputError(
            f'cannot resume: {path} is not a checkpoint of this version that can be '
            f'read safely ({first[:160]})'
        ) from None
    if not isinstance(ckpt, dict):
        raise AdaptInputError(f'cannot resume: {path} does not hold a checkpoint')
    return ckpt


def _ckpt_save(trainer: AdaptTrainer, path: str) -> None:
    # Serialised in memory, then written atomically: torch's own file writer reports a full disk
    # as a RuntimeError from C++ ("enforce fail"), this way it is a plain OSError naming the file.
    buf = _io.BytesIO()
    torch.save(trainer.state_dict(), buf)
    write_bytes(path, buf.getvalue())


def _csv(rows: List[Dict]) -> str:
    if not rows:
        return ''
    cols: List[str] = []
    for r in rows:
        cols += [c for c in r if c not in cols]
    buf = _io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator='\n')
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def write_metrics(trainer: AdaptTrainer, out: str) -> None:
    st = trainer.state
    write_text(os.path.join(out, 'metrics.csv'), _csv(st.history))
    write_text(os.path.join(out, 'evals.csv'), _csv(st.evals))
    write_json(os.path.join(out, 'metrics.json'), {'steps': st.history, 'evals': st.evals})


def export_torchscript(trainer: AdaptTrainer, path: str) -> None:
    """Save ``trainer.model`` as TorchScript on the CPU: eta (input normalisation, bottleneck,
    classifier) or, of a :class:`~pwan_ros.adaptation.linear.LinearSource`, the input
    normalisation and one linear layer."""
    import copy
    import warnings

    model = copy.deepcopy(trainer.model).to('cpu').eval()
    with warnings.catch_warnings():
        # TorchScript is deprecated in recent torch releases but still the format every libtorch
        # and older PyTorch consumer loads; the warning is not actionable for the user here.
        warnings.simplefilter('ignore', DeprecationWarning)
        scripted = torch.jit.script(model)
        buf = _io.BytesIO()
        torch.jit.save(scripted, buf)
    write_bytes(path, buf.getvalue())


def run_adaptation(
    config: AdaptConfig,
    labelled,
    unlabelled,
    output_dir: str,
    resume: bool = False,
    on_step: Optional[Callable[[AdaptTrainer, StepMetrics], None]] = None,
    on_eval: Optional[Callable[[AdaptTrainer, UnlabelledPass], None]] = None,
    should_stop: Optional[Callable[[], bool]] = None,
    log: Callable[[str], None] = lambda s: None,
    check=None,
) -> AdaptResult:
    """Train on ``labelled`` / ``unlabelled`` (paths or :class:`FeatureSet`) and write the outputs.

    ``check`` (a path, a :class:`FeatureSet` or None): labelled rows of the unlabelled domain; the
    safeguard's two candidates are compared on them (:func:`safeguard.check_candidates`,
    ``config.check_alpha``) after the label-free decision, which a decided comparison replaces.

    With ``resume`` the run continues from ``output_dir/checkpoints/latest.pt`` (an error when it
    does not exist). Inputs and the output directory are validated before anything is written;
    an output that cannot be written (read-only, full disk) raises :class:`AdaptOutputError`. When
    ``should_stop`` returns True the run stops, writes ``latest.pt`` and the metrics, and returns
    with ``completed=False``.
    """
    try:
        check_output(output_dir, directory=True)
    except OutputError as exc:
        raise AdaptOutputError(str(exc)) from None
    created = [
        d for d in (output_dir, os.path.join(output_dir, 'checkpoints')) if not os.path.exists(d)
    ]
    opened = not isinstance(labelled, FeatureSet)
    lab, unl = (
        load_inputs(labelled, unlabelled, config.memory_limit_mb)
        if opened
        else (labelled, unlabelled)
    )
    chk = None
    try:
        chk = _check_rows(check, config, lab)
        hooks = _Hooks(on_step, on_eval, should_stop, log)
        return _run(_Job(config, lab, unl, os.path.abspath(output_dir), chk, resume, hooks))
    except OSError as exc:  # writing an output failed part-way (full disk, permissions changed)
        for d in reversed(created):  # directories this run made and left empty
            with contextlib.suppress(OSError):
                os.rmdir(d)
        raise AdaptOutputError(os_error_text(exc)) from None
    finally:
        if opened:
            lab.close()
            unl.close()
        if chk is not None and not isinstance(check, FeatureSet):
            chk.close()


def _check_rows(check, config: AdaptConfig, lab: FeatureSet) -> Optional[FeatureSet]:
    """The check rows (``check``: a path, a :class:`FeatureSet` or None/''), validated against
    the labelled set; an :class:`AdaptInputError` / :class:`AdaptConfigError` when unusable."""
    if check is None or (isinstance(check, str) and not check):
        return None
    if not config.safeguard or config.method == 'source_only':
        raise AdaptConfigError(
            'check rows compare the safeguard\'s two candidates: they need safeguard: true and '
            'method pwan or wgan'
        )
    chk = (
        check
        if isinstance(check, FeatureSet)
        else load_npz(check, 'check', require_labels=True, max_memory_mb=config.memory_limit_mb)
    )
    try:
        if chk.labels is None or chk.n == 0:
            raise AdaptInputError(f'check file {chk.path}: no labelled rows')
        if chk.dim != lab.dim:
            raise AdaptInputError(
                f'feature dimensions differ: labelled {lab.path} has D={lab.dim}, check '
                f'{chk.path} has D={chk.dim}'
            )
        if (
            chk.class_names is not None
            and lab.class_names is not None
            and chk.class_names != lab.class_names
        ):
            raise AdaptInputError(
                f'check file {chk.path}: class_names {chk.class_names} differ from the labelled '
                f'file\'s {lab.class_names} (the same ids must name the same classes)'
            )
        k = len(lab.class_names) if lab.class_names is not None else int(lab.labels.max()) + 1
        if chk.labels.min() < 0 or chk.labels.max() >= k:
            bad = int(chk.labels.min()) if chk.labels.min() < 0 else int(chk.labels.max())
            raise AdaptInputError(f'check file {chk.path}: label {bad} out of range 0..{k - 1}')
    except BaseException:
        if not isinstance(check, FeatureSet):
            chk.close()
        raise
    return chk


@dataclass(frozen=True)
class _Hooks:
    """The caller's callbacks: per step, per evaluation, the stop request, the log."""

    on_step: Optional[Callable]
    on_eval: Optional[Callable]
    should_stop: Optional[Callable[[], bool]]
    log: Callable[[str], None]


@dataclass(frozen=True)
class _Job:
    """One adaptation run: its config, the labelled / unlabelled / check sets, the output
    directory (absolute), whether it resumes, and the caller's hooks."""

    config: AdaptConfig
    lab: FeatureSet
    unl: FeatureSet
    out: str
    chk: Optional[FeatureSet]
    resume: bool
    hooks: _Hooks

    @property
    def latest(self) -> str:
        return os.path.join(self.out, 'checkpoints', 'latest.pt')

    @property
    def best(self) -> str:
        return os.path.join(self.out, 'checkpoints', 'best.pt')


def _run(job: _Job) -> AdaptResult:
    """Train, decide what to deploy (the safeguard, the check rows), write the outputs."""
    config = job.config
    torch_threads = torch.get_num_threads()
    if config.threads > 0:
        torch.set_num_threads(config.threads)
    try:
        trainer, holdout = _trainer(job)
        done, last_eval = _train(job, trainer)
        res = decision = None
        accuracies = (None, None)
        if done:
            res = _final_eval(job, trainer, last_eval)
            res, decision, accuracies = _deploy(job, trainer, holdout, res)
        else:
            job.hooks.log(f'stopped at step {trainer.state.step}; checkpoint {job.latest}')
        result = _result(trainer, res, job, done, decision, *accuracies)
        write_json(result.summary_path, result.to_dict())
        return result
    finally:
        torch.set_num_threads(torch_threads)


def _trainer(job: _Job) -> tuple:
    """(the trainer, ready to train or resumed; the safeguard's held-out rows or None)."""
    config = job.config
    check_pair(job.lab, job.unl)  # the labels before the split counts their classes
    guarded = config.safeguard and config.method != 'source_only'
    holdout = (
        holdout_split(job.lab.labels, config.holdout_fraction, config.seed) if guarded else None
    )
    trainer = AdaptTrainer(config, job.lab, job.unl, holdout)
    if guarded:  # the source-only companion, step by step beside it, judged against
        trainer.attach_companions()
        trainer.selector = SnapshotSelector(holdout, config.safeguard_margin, config.min_agreement)
    if job.resume:
        if not os.path.isfile(job.latest):
            raise AdaptInputError(f'cannot resume: {job.latest} does not exist')
        trainer.load_state_dict(load_checkpoint(job.latest))
        job.hooks.log(f'resumed from {job.latest} at step {trainer.state.step}')
    os.makedirs(os.path.dirname(job.latest), exist_ok=True)
    return trainer, holdout


def _train(job: _Job, trainer: AdaptTrainer) -> tuple:
    """Train (checkpoints, the best snapshot, metrics written as it goes). Returns (whether it
    completed, [the last evaluation] or [])."""
    last_eval: List[UnlabelledPass] = []

    def eval_hook(tr, res, is_best):
        last_eval[:] = [res]
        if is_best:
            _ckpt_save(tr, job.best)
        if job.hooks.on_eval is not None:
            job.hooks.on_eval(tr, res)

    def ckpt_hook(tr):
        _ckpt_save(tr, job.latest)

    done = trainer.train(
        on_step=job.hooks.on_step,
        on_eval=eval_hook,
        on_checkpoint=ckpt_hook,
        should_stop=job.hooks.should_stop,
    )
    _ckpt_save(trainer, job.latest)
    write_metrics(trainer, job.out)
    return done, last_eval


def _final_eval(job: _Job, trainer: AdaptTrainer, last_eval: list) -> UnlabelledPass:
    """The evaluation at the final step (the last one when it was there), recorded."""
    res = (
        last_eval[0]
        if last_eval and last_eval[0].step == trainer.state.step
        else trainer.evaluate()
    )
    if not last_eval or last_eval[0] is not res:
        if trainer.record_eval(res):
            _ckpt_save(trainer, job.best)
        write_metrics(trainer, job.out)
    return res


def _deploy(job: _Job, trainer: AdaptTrainer, holdout, res: UnlabelledPass) -> tuple:
    """Decide what to deploy (the safeguard, then the check rows) and write it: predictions,
    model.ts, the candidates, plots. Returns (the deployed model's evaluation, the decision or
    None, (adapted accuracy, source-only accuracy))."""
    deployed, adapted_res, decision, source = trainer, res, None, None
    if holdout is not None:
        decision, source, adapted_res = _safeguard(job, trainer, holdout, res)
        if decision.deployed == 'source_only':
            deployed = source
    out = job.out
    source_res = None if source is None else source.evaluate()
    final = adapted_res if deployed is trainer else source_res
    write_npy(os.path.join(out, 'predictions.npy'), final.predictions)
    export_torchscript(deployed, os.path.join(out, 'model.ts'))
    if trainer.config.plots:
        from .plots import write_plots

        write_plots(trainer, os.path.join(out, 'plots'))
    accuracies = (adapted_res.accuracy, None if source_res is None else source_res.accuracy)
    return final, decision, accuracies


def _safeguard(job: _Job, trainer: AdaptTrainer, holdout, res: UnlabelledPass) -> tuple:
    """The safeguard's decision between the adapted model and the source-only models (on the
    held-out labelled rows, then the check rows of the new domain when given), the candidates
    written. Returns (decision, the chosen source-only model on all labelled rows, the adapted
    model's evaluation)."""
    config, log = job.config, job.hooks.log
    ref = Reference.of(trainer.companion, holdout)
    kept_step = trainer.state.best_step
    decision = decide(trainer, ref, config.safeguard_margin, config.min_agreement)
    if trainer.state.best_step != kept_step:  # the final weights replaced it
        _ckpt_save(trainer, job.best)
    adapted_res = res
    if decision.adapted_step is not None:  # it passed: the candidate is the kept snapshot
        if trainer.restore_snapshot() and trainer.state.best_step != res.step:
            adapted_res = trainer.evaluate()
    linear, evidence = linear_candidate(trainer, trainer.companion, ref)
    decision = consider_linear(decision, evidence, config.check_alpha)
    label_free = 'label-free decision' if job.chk is not None else 'deploying'
    log(f'safeguard: {label_free} {decision.label}: {decision.reason}')
    source = linear if decision.source_only_model == 'linear' else trainer.fallback
    cand = os.path.join(job.out, 'candidates')
    os.makedirs(cand, exist_ok=True)
    export_torchscript(trainer, os.path.join(cand, 'adapted.ts'))
    export_torchscript(trainer.fallback, os.path.join(cand, 'source_only.ts'))
    export_torchscript(linear, os.path.join(cand, 'source_only_linear.ts'))
    if job.chk is not None:  # labelled rows of the unlabelled domain: direct evidence
        kept_step = trainer.state.best_step
        verdict = check_candidates(trainer, source, job.chk, config.check_alpha)
        decision = apply_check(decision, verdict, trainer)
        if trainer.state.best_step != kept_step:  # the checked final weights
            _ckpt_save(trainer, job.best)
        log(f'safeguard: {verdict.describe()}: deploying {decision.label}')
    return decision, source, adapted_res


def _result(
    tr: AdaptTrainer,
    res: Optional[UnlabelledPass],
    job: _Job,
    done: bool,
    decision: Optional[SafeguardDecision],
    adapted_acc,
    source_acc,
) -> AdaptResult:
    out, latest, best = job.out, job.latest, job.best
    cfg, st, k = tr.config, tr.state, tr.num_classes
    # Classes predicted for more than 1/K of the unlabelled rows at the end (hard predictions).
    frac = res.class_fraction if res is not None else st.mu / k
    return AdaptResult(
        completed=done,
        method=cfg.method,
        steps_done=st.step,
        steps=cfg.steps,
        seed=cfg.seed,
        device=str(tr.device),
        train_seconds=round(st.train_seconds, 3),
        num_classes=k,
        class_names=tr.labelled.class_names,
        n_labelled=tr.labelled.n,
        n_unlabelled=tr.unlabelled.n,
        m0=float(st.m0),
        m_alpha=tr.m_alpha(),
        class_weights=[float(v) for v in st.mu],
        estimated_present_classes=[int(c) for c in np.flatnonzero(frac > 1.0 / k)],
        mean_entropy=None if res is None else float(res.mean_entropy),
        best_step=int(st.best_step),
        best_entropy=None if st.best_step < 0 else float(st.best_entropy),
        prediction_histogram=None
        if res is None
        else np.bincount(res.predictions, minlength=k).tolist(),
        accuracy=None if res is None else res.accuracy,
        absent_class_fraction=None if res is None else res.absent_fraction,
        deployed=None
        if not done
        else (
            decision.deployed
            if decision is not None
            else ('source_only' if cfg.method == 'source_only' else 'adapted')
        ),
        source_only_model=None
        if not done
        else (
            decision.source_only_model
            if decision is not None
            else ('mlp' if cfg.method == 'source_only' else None)
        ),
        deployed_reason=None
        if not done
        else (
            decision.reason
            if decision is not None
            else 'safeguard off'
            if cfg.method != 'source_only'
            else 'method source_only'
        ),
        safeguard=None if decision is None else decision.to_dict(),
        adapted_accuracy=adapted_acc if cfg.method != 'source_only' else None,
        source_only_accuracy=source_acc if cfg.method != 'source_only' else adapted_acc,
        output_dir=out,
        predictions_path=os.path.join(out, 'predictions.npy') if done else None,
        model_path=os.path.join(out, 'model.ts') if done else None,
        checkpoint_path=latest,
        best_checkpoint_path=best if os.path.isfile(best) else None,
        summary_path=os.path.join(out, 'summary.json'),
    )
