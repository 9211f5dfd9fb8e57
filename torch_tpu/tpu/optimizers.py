"""``torch.tpu.optimizers``: functional optimizers and a one-program training step (TorchTPU 0.2's names).

The optimizers hold hyper-parameters only (their constructors take no ``params``, as in
TorchTPU); parameters and optimizer state are passed in, so a whole training step (forward, loss,
gradients and update) can be traced by ``torch.compile`` as one graph. The contract:

- ``state = opt.init(params)``: ``params`` is a mapping ``{name: Tensor}`` or a list/tuple of
  tensors; ``state`` is a dict ``{"step": 0-dim float32 Tensor, "slots": <params' container of
  {slot_name: Tensor}>}`` (slots: ``exp_avg``/``exp_avg_sq``/``max_exp_avg_sq`` for AdamW,
  ``momentum_buffer`` for Sgd and Muon), on the parameters' devices.
- ``new_params, new_state = opt.update(params, grads, state)``: pure, nothing is mutated;
  ``grads`` has the container of ``params``. Differentiable, traceable by Dynamo.
- ``opt.step(params, grads, state)``: the same update written in place into ``params`` and
  ``state`` (under ``torch.no_grad()``); returns ``None``. The tensors keep their identity, so
  ``params`` may be a model's own parameters (``dict(model.named_parameters())``).

Each update follows the single-tensor algorithm of ``torch.optim.AdamW`` / ``torch.optim.SGD`` /
``torch.optim.Muon`` of torch 2.13 op by op; the bias corrections of AdamW are computed from the
step count held as a tensor (``torch.optim``'s ``capturable`` form), so that a compiled step has
no Python number that changes every step.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

__all__ = ["Optimizer", "AdamW", "Sgd", "Muon", "SingleTraceTrainer",
           "DEFAULT_A", "DEFAULT_B", "DEFAULT_C", "EPS", "DEFAULT_NS_STEPS"]

# torch.optim.Muon's constants in torch 2.13 (torch/optim/_muon.py), so that the two agree exactly.
EPS = 1e-7
DEFAULT_A = 3.4445
DEFAULT_B = -4.7750
DEFAULT_C = 2.0315
DEFAULT_NS_STEPS = 5


def _check_number(name: str, value: Any, *, low: float = 0.0, high: float | None = None,
                  high_open: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    value = float(value)
    if not value >= low or math.isnan(value):
        raise ValueError(f"{name} must be >= {low}, got {value}")
    if high is not None and not (value < high if high_open else value <= high):
        raise ValueError(f"{name} must be in [{low}, {high}{')' if high_open else ']'}, got {value}")
    return value


def _check_flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def _check_optional_tensor(name: str, value: Any) -> torch.Tensor | None:
    if value is not None and not (isinstance(value, torch.Tensor) and value.numel() == 1):
        raise TypeError(f"{name} must be None or a 1-element Tensor, got {type(value).__name__}")
    return value


def _items(tree: Any, what: str) -> list[tuple[Any, Any]]:
    """(key, value) pairs of a params-like container: a mapping or a list/tuple."""
    if isinstance(tree, Mapping):
        return list(tree.items())
    if isinstance(tree, (list, tuple)):
        return list(enumerate(tree))
    raise TypeError(f"{what} must be a mapping of name -> Tensor or a list/tuple of Tensors, "
                    f"got {type(tree).__name__}")


def _rebuild(like: Any, values: list[Any]) -> Any:
    if isinstance(like, Mapping):
        return dict(zip(like.keys(), values))
    return type(like)(values) if isinstance(like, tuple) else list(values)


def _label(key: Any) -> str:
    return f"[{key!r}]"


class Optimizer:
    """Base of the functional optimizers: hyper-parameters here, parameters and state passed in.

    ``lr`` (>= 0) and ``weight_decay`` (>= 0) are floats. A subclass defines ``_slots(param)``
    (its per-parameter state, as tensors; optionally ``_slot_names()``, their names, so that the
    state of another optimizer is refused naming them) and ``_update_param(param, grad, slots, step)``
    returning ``(new_param, new_slots)``; ``init``/``update``/``step`` do the rest (see the
    module docstring). Bad input raises ``TypeError``/``ValueError`` naming the argument.
    """

    _name = "Optimizer"

    def __init__(self, lr: float = 0.001, weight_decay: float = 0.0) -> None:
        self.lr = _check_number("lr", lr)
        self.weight_decay = _check_number("weight_decay", weight_decay)
        self.grad_scale: torch.Tensor | None = None
        self.found_inf: torch.Tensor | None = None
        self.capturable = True
        self.use_bfloat16_moments = False

    # -- what a subclass provides -------------------------------------------------------------
    def _check_param(self, label: str, param: torch.Tensor) -> None:
        """Raise for a parameter this optimizer cannot update (``label`` names it)."""

    def _slots(self, param: torch.Tensor) -> dict[str, torch.Tensor]:
        return {}

    def _slot_names(self) -> tuple[str, ...] | None:
        """The names ``_slots`` gives every parameter (checked against a state passed in), or
        ``None``: not known without building them (a subclass that defines only ``_slots``)."""
        return () if type(self)._slots is Optimizer._slots else None

    def _update_param(self, param, grad, slots, step):
        raise NotImplementedError(f"{type(self).__name__} must define _update_param(param, grad, slots, step)")

    # -- the functional contract --------------------------------------------------------------
    def _moment_dtype(self, param: torch.Tensor) -> torch.dtype:
        return torch.bfloat16 if self.use_bfloat16_moments and param.is_floating_point() else param.dtype

    def _checked_params(self, params: Any, what: str = "params") -> list[tuple[Any, torch.Tensor]]:
        pairs = _items(params, what)
        for key, p in pairs:
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"{what}{_label(key)} must be a Tensor, got {type(p).__name__}")
            if not p.is_floating_point():
                raise TypeError(f"{what}{_label(key)} must be a floating-point Tensor, got {p.dtype}")
            self._check_param(f"{what}{_label(key)}", p)
        return pairs

    def init(self, params: Any) -> dict[str, Any]:
        """The initial state for ``params`` (a mapping name -> Tensor or a list/tuple of Tensors).

        Returns ``{"step": 0-dim float32 zero, "slots": params' container of per-parameter slot
        dicts}``; the step lives on the first parameter's device (on the CPU when
        ``capturable=False`` or there is no parameter). Raises ``TypeError`` for a non-tensor or
        non-floating parameter, ``ValueError`` for one the optimizer cannot update (Muon: not 2-D).
        """
        pairs = self._checked_params(params)
        device = pairs[0][1].device if pairs and self.capturable else torch.device("cpu")
        with torch.no_grad():
            slots = [self._slots(p) for _, p in pairs]
        return {"step": torch.zeros((), dtype=torch.float32, device=device),
                "slots": _rebuild(params if isinstance(params, Mapping) else list(params), slots)}

    def _check_state(self, params: Any, grads: Any, state: Any):
        pairs = self._checked_params(params)
        if not isinstance(state, Mapping) or "step" not in state or "slots" not in state:
            raise TypeError("state must be the dict returned by init(params) ({'step': ..., 'slots': ...})")
        gpairs = _items(grads, "grads")
        spairs = _items(state["slots"], "state['slots']")
        if [k for k, _ in gpairs] != [k for k, _ in pairs]:
            raise ValueError(f"grads must have the keys of params {[k for k, _ in pairs]}, "
                             f"got {[k for k, _ in gpairs]}")
        if [k for k, _ in spairs] != [k for k, _ in pairs]:
            raise ValueError("state['slots'] does not match params (was it made by init() for other params?)")
        for (key, p), (_, g) in zip(pairs, gpairs):
            if not isinstance(g, torch.Tensor):
                raise TypeError(f"grads{_label(key)} must be a Tensor, got {type(g).__name__}")
            if g.shape != p.shape:
                raise ValueError(f"grads{_label(key)} has shape {list(g.shape)}, params{_label(key)} {list(p.shape)}")
        if not isinstance(state["step"], torch.Tensor):
            raise TypeError("state['step'] must be a Tensor (as init(params) makes it), "
                            f"got {type(state['step']).__name__}")
        names = self._slot_names()
        for (key, p), (_, slots) in zip(pairs, spairs):
            where = f"state['slots']{_label(key)}"
            if not isinstance(slots, Mapping):
                raise TypeError(f"{where} must be a dict of slot tensors, got {type(slots).__name__}")
            if names is not None and sorted(slots) != sorted(names):
                raise ValueError(f"{where} has slots {sorted(slots)}, {type(self).__name__} keeps {sorted(names)} "
                                 "(was the state made by init() of another optimizer or configuration?)")
            for name, s in slots.items():
                if not isinstance(s, torch.Tensor):
                    raise TypeError(f"{where}[{name!r}] must be a Tensor, got {type(s).__name__}")
                if s.shape != p.shape:
                    raise ValueError(f"{where}[{name!r}] has shape {list(s.shape)}, params{_label(key)} "
                                     f"{list(p.shape)} (was the state made by init() for other params?)")
        return pairs, gpairs, spairs

    def update(self, params: Any, grads: Any, state: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
        """One optimizer step without mutation: returns ``(new_params, new_state)``.

        ``grads`` has the container (keys/length) and shapes of ``params``; ``state`` comes from
        ``init(params)`` or an earlier ``update``. With ``grad_scale``, gradients are divided by
        it first; with ``found_inf`` (nonzero), parameters and state come back unchanged.
        """
        pairs, gpairs, spairs = self._check_state(params, grads, state)
        step = state["step"] + 1
        new_params, new_slots = [], []
        for (_, p), (_, g), (_, slots) in zip(pairs, gpairs, spairs):
            if self.grad_scale is not None:
                g = g / self.grad_scale.to(g.device)
            np_, ns = self._update_param(p, g, dict(slots), step)
            if self.found_inf is not None:
                skip = self.found_inf.to(p.device) != 0
                np_ = torch.where(skip, p, np_)
                ns = {k: torch.where(skip, slots[k], v) for k, v in ns.items()}
            new_params.append(np_)
            new_slots.append(ns)
        if self.found_inf is not None:
            step = torch.where(self.found_inf.to(step.device) != 0, state["step"], step)
        return (_rebuild(params, new_params),
                {"step": step, "slots": _rebuild(state["slots"], new_slots)})

    def step(self, params: Any, grads: Any, state: Mapping[str, Any]) -> None:
        """``update`` written in place: each tensor of ``params`` and ``state`` gets its new value."""
        new_params, new_state = self.update(params, grads, state)
        with torch.no_grad():
            for (_, p), (_, q) in zip(_items(params, "params"), _items(new_params, "params")):
                p.copy_(q)
            state["step"].copy_(new_state["step"])
            for (_, s), (_, t) in zip(_items(state["slots"], "state"), _items(new_state["slots"], "state")):
                for name, value in t.items():
                    s[name].copy_(value)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"


class AdamW(Optimizer):
    """AdamW (decoupled weight decay) as ``torch.optim.AdamW``'s single-tensor algorithm.

    ``lr``, ``weight_decay``, ``eps`` >= 0; ``beta1``, ``beta2`` in [0, 1). With
    ``use_bfloat16_moments`` (the default, as in TorchTPU) ``exp_avg`` / ``exp_avg_sq`` (and
    ``max_exp_avg_sq``) are stored in bfloat16: each step reads them as float32, computes the
    moments and the parameter update in float32, then stores the moments rounded to bfloat16.
    ``amsgrad`` and ``maximize`` as in torch.optim. ``foreach``, ``fused`` and ``differentiable``
    are accepted and change nothing (the update is one fused program under ``torch.compile`` and
    always differentiable). ``capturable=False`` keeps the step count on the CPU.
    ``grad_scale`` / ``found_inf``: see ``Optimizer.update``.
    """

    def __init__(self, lr: float = 0.001, weight_decay: float = 0.01, beta1: float = 0.9, beta2: float = 0.999,
                 eps: float = 1e-08, use_bfloat16_moments: bool = True, amsgrad: bool = False,
                 maximize: bool = False, foreach: bool | None = False, capturable: bool = True,
                 differentiable: bool = False, fused: bool | None = False,
                 grad_scale: torch.Tensor | None = None, found_inf: torch.Tensor | None = None) -> None:
        super().__init__(lr, weight_decay)
        self.beta1 = _check_number("beta1", beta1, high=1.0)
        self.beta2 = _check_number("beta2", beta2, high=1.0)
        self.eps = _check_number("eps", eps)
        self.use_bfloat16_moments = _check_flag("use_bfloat16_moments", use_bfloat16_moments)
        self.amsgrad = _check_flag("amsgrad", amsgrad)
        self.maximize = _check_flag("maximize", maximize)
        self.capturable = _check_flag("capturable", capturable)
        self.differentiable = _check_flag("differentiable", differentiable)
        self.foreach, self.fused = foreach, fused
        self.grad_scale = _check_optional_tensor("grad_scale", grad_scale)
        self.found_inf = _check_optional_tensor("found_inf", found_inf)

    def _slot_names(self):
        return ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") if self.amsgrad else ("exp_avg", "exp_avg_sq")

    def _slots(self, param):
        dtype = self._moment_dtype(param)
        return {n: torch.zeros_like(param, dtype=dtype, memory_format=torch.preserve_format)
                for n in self._slot_names()}

    def _update_param(self, param, grad, slots, step):
        grad = -grad if self.maximize else grad
        step = step.to(param.device)  # one step count for all parameters, which may sit on several chips
        store = slots["exp_avg"].dtype
        exp_avg = slots["exp_avg"].to(param.dtype)
        exp_avg_sq = slots["exp_avg_sq"].to(param.dtype)
        if self.weight_decay != 0:
            param = param.mul(1 - self.lr * self.weight_decay)
        exp_avg = exp_avg.lerp(grad, 1 - self.beta1)
        exp_avg_sq = exp_avg_sq.mul(self.beta2).addcmul(grad, grad, value=1 - self.beta2)
        bias_correction1 = 1 - self.beta1 ** step
        bias_correction2_sqrt = (1 - self.beta2 ** step).sqrt()
        step_size = self.lr / bias_correction1
        new = {"exp_avg": exp_avg.to(store), "exp_avg_sq": exp_avg_sq.to(store)}
        if self.amsgrad:
            max_sq = torch.maximum(slots["max_exp_avg_sq"].to(param.dtype), exp_avg_sq)
            new["max_exp_avg_sq"] = max_sq.to(store)
            exp_avg_sq = max_sq
        denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add(self.eps)
        return param - step_size * (exp_avg / denom), new


class Sgd(Optimizer):
    """SGD as ``torch.optim.SGD``'s single-tensor algorithm (momentum, dampening, Nesterov, L2 weight decay).

    ``lr``, ``momentum``, ``dampening``, ``weight_decay`` >= 0; ``nesterov`` needs ``momentum > 0``
    and ``dampening == 0`` (``ValueError`` otherwise, as torch.optim). The first step's momentum
    buffer is the gradient itself (as torch.optim's). ``foreach`` / ``fused`` are accepted and change
    nothing; ``has_sparse_grad=True`` raises ``NotImplementedError`` (dense gradients only).
    ``grad_scale`` / ``found_inf``: see ``Optimizer.update``.
    """

    def __init__(self, lr: float = 0.001, momentum: float = 0.0, dampening: float = 0.0, weight_decay: float = 0.0,
                 nesterov: bool = False, maximize: bool = False, foreach: bool | None = False,
                 fused: bool | None = True, grad_scale: torch.Tensor | None = None,
                 found_inf: torch.Tensor | None = None, has_sparse_grad: bool = False) -> None:
        super().__init__(lr, weight_decay)
        self.momentum = _check_number("momentum", momentum)
        self.dampening = _check_number("dampening", dampening)
        self.nesterov = _check_flag("nesterov", nesterov)
        self.maximize = _check_flag("maximize", maximize)
        if self.nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise ValueError(f"nesterov=True requires momentum > 0 and dampening == 0, "
                             f"got momentum={self.momentum}, dampening={self.dampening}")
        if _check_flag("has_sparse_grad", has_sparse_grad):
            raise NotImplementedError("has_sparse_grad=True: torch.tpu.optimizers.Sgd takes dense gradients only")
        self.has_sparse_grad = False
        self.foreach, self.fused = foreach, fused
        self.grad_scale = _check_optional_tensor("grad_scale", grad_scale)
        self.found_inf = _check_optional_tensor("found_inf", found_inf)

    def _slot_names(self):
        return () if self.momentum == 0 else ("momentum_buffer",)

    def _slots(self, param):
        if self.momentum == 0:
            return {}
        return {"momentum_buffer": torch.zeros_like(param, memory_format=torch.preserve_format)}

    def _update_param(self, param, grad, slots, step):
        grad = grad if not self.maximize else -grad
        if self.weight_decay != 0:
            grad = grad.add(param, alpha=self.weight_decay)
        new = {}
        if self.momentum != 0:
            buf = slots["momentum_buffer"].mul(self.momentum).add(grad, alpha=1 - self.dampening)
            buf = torch.where(step.to(grad.device) == 1, grad, buf)  # torch.optim: the first buffer is the gradient
            new["momentum_buffer"] = buf
            grad = grad.add(buf, alpha=self.momentum) if self.nesterov else buf
        return param.add(grad, alpha=-self.lr), new


def _adjusted_lr(lr: float, adjust_lr_fn: str | None, shape: torch.Size) -> float:
    rows, cols = shape[:2]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return lr * math.sqrt(max(1, rows / cols))
    return lr * 0.2 * math.sqrt(max(rows, cols))  # "match_rms_adamw"


def _newton_schulz(update: torch.Tensor, coefficients: tuple[float, float, float], steps: int,
                   eps: float) -> torch.Tensor:
    a, b, c = coefficients
    x = update.bfloat16()
    tall = update.size(0) > update.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


class Muon(Optimizer):
    """Muon (momentum, then Newton-Schulz orthogonalisation in bfloat16) as ``torch.optim.Muon``.

    For 2-D parameters only: ``init``/``update`` raise ``ValueError`` naming a parameter of another
    rank (torch.optim.Muon raises at its constructor). ``lr``, ``weight_decay``, ``momentum``,
    ``eps`` >= 0; ``ns_coefficients`` three floats; ``ns_steps`` an int in [0, 100);
    ``adjust_lr_fn`` ``None``/``"original"`` (lr * sqrt(max(1, rows/cols))) or ``"match_rms_adamw"``
    (0.2 * lr * sqrt(max(rows, cols))). ``use_bfloat16_moments`` stores the momentum buffer in
    bfloat16. ``foreach`` is accepted and changes nothing; ``has_complex=True`` raises ``ValueError``.
    """

    def __init__(self, lr: float = 0.001, weight_decay: float = 0.1, momentum: float = 0.95, nesterov: bool = True,
                 ns_coefficients: tuple[float, float, float] = (DEFAULT_A, DEFAULT_B, DEFAULT_C), eps: float = EPS,
                 ns_steps: int = DEFAULT_NS_STEPS, adjust_lr_fn: str | None = None,
                 use_bfloat16_moments: bool = False, foreach: bool | None = False, has_complex: bool = False) -> None:
        super().__init__(lr, weight_decay)
        self.momentum = _check_number("momentum", momentum)
        self.nesterov = _check_flag("nesterov", nesterov)
        if (not isinstance(ns_coefficients, (tuple, list)) or len(ns_coefficients) != 3
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in ns_coefficients)):
            raise ValueError(f"ns_coefficients must be a tuple of exactly 3 floats, got {ns_coefficients!r}")
        self.ns_coefficients = tuple(float(v) for v in ns_coefficients)
        self.eps = _check_number("eps", eps)
        if isinstance(ns_steps, bool) or not isinstance(ns_steps, int):
            raise TypeError(f"ns_steps must be an int, got {type(ns_steps).__name__}")
        if not 0 <= ns_steps < 100:
            raise ValueError(f"ns_steps must be in [0, 100), got {ns_steps}")
        self.ns_steps = ns_steps
        if adjust_lr_fn not in (None, "original", "match_rms_adamw"):
            raise ValueError(f"adjust_lr_fn must be None, 'original' or 'match_rms_adamw', got {adjust_lr_fn!r}")
        self.adjust_lr_fn = adjust_lr_fn
        self.use_bfloat16_moments = _check_flag("use_bfloat16_moments", use_bfloat16_moments)
        if _check_flag("has_complex", has_complex):
            raise ValueError("has_complex=True: Muon does not support complex parameters")
        self.has_complex = False
        self.foreach = foreach

    def _check_param(self, label, param):
        if param.ndim != 2:
            raise ValueError(f"{label}: Muon only supports 2D parameters, got one of size {tuple(param.shape)} "
                             f"(optimize biases, norms and embeddings with AdamW)")

    def _slot_names(self):
        return ("momentum_buffer",)

    def _slots(self, param):
        return {"momentum_buffer": torch.zeros_like(param, dtype=self._moment_dtype(param),
                                                    memory_format=torch.preserve_format)}

    def _update_param(self, param, grad, slots, step):
        store = slots["momentum_buffer"].dtype
        buf = slots["momentum_buffer"].to(grad.dtype).lerp(grad, 1 - self.momentum)
        update = grad.lerp(buf, self.momentum) if self.nesterov else buf
        update = _newton_schulz(update, self.ns_coefficients, self.ns_steps, self.eps)
        lr = _adjusted_lr(self.lr, self.adjust_lr_fn, param.shape)
        param = param.mul(1 - self.lr * self.weight_decay).add(update, alpha=-lr)
        return param, {"momentum_buffer": buf.to(store)}


def _loss_from_output(output: Any) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        loss = output
    elif isinstance(output, Mapping) and "loss" in output:
        loss = output["loss"]
    elif getattr(output, "loss", None) is not None:
        loss = output.loss
    else:
        raise TypeError(f"SingleTraceTrainer: the model returned {type(output).__name__}; without compute_loss_fn "
                        "it must return the loss (a 0-dim Tensor, or an object/dict with 'loss')")
    if not isinstance(loss, torch.Tensor) or loss.ndim != 0:
        raise ValueError(f"SingleTraceTrainer: the loss must be a 0-dim Tensor, got "
                         f"{tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__}")
    return loss


class SingleTraceTrainer:
    """A training step traced as one program: forward, loss, gradients and the optimizer update.

    ``model``: an ``nn.Module`` whose trainable parameters (``requires_grad``) are trained.
    ``optimizer``: a ``torch.tpu.optimizers`` optimizer (default ``AdamW()``). ``compile_fn``: applied
    once to the step function (default ``torch.compile(fn, backend="tpu")``; ``lambda f: f`` runs
    the same step eagerly). ``compute_loss_fn(outputs, *targets) -> 0-dim Tensor``; without it the
    model's output is the loss (a 0-dim Tensor, or ``output.loss`` / ``output["loss"]``).

    ``trainer.step(inputs, *targets)`` runs one step and returns the loss (detached): ``inputs`` is
    a Tensor (``model(inputs)``), a tuple/list (``model(*inputs)``) or a dict (``model(**inputs)``).
    Gradients come from ``torch.func.grad_and_value`` over ``torch.func.functional_call``, so the
    whole step is one graph for Dynamo (no ``.grad`` is written); the update is written in place into
    the model's parameters and ``trainer.state`` (``optimizer.init`` of them). Buffers are read, not
    updated by the step (a model that changes its buffers in forward, e.g. training batch norm,
    raises through torch.func).
    """

    def __init__(self, model: torch.nn.Module, optimizer: Any = None, compile_fn: Callable[..., Any] | None = None,
                 compute_loss_fn: Callable[..., torch.Tensor] | None = None) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        optimizer = AdamW() if optimizer is None else optimizer
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"optimizer must be a torch.tpu.optimizers.Optimizer (AdamW, Sgd, Muon, ...) or None, "
                            f"got {type(optimizer).__name__}")
        if compile_fn is not None and not callable(compile_fn):
            raise TypeError(f"compile_fn must be callable or None, got {type(compile_fn).__name__}")
        if compute_loss_fn is not None and not callable(compute_loss_fn):
            raise TypeError(f"compute_loss_fn must be callable or None, got {type(compute_loss_fn).__name__}")
        self.model = model
        self.optimizer = optimizer
        self.compute_loss_fn = compute_loss_fn
        self.compile_fn = compile_fn if compile_fn is not None else functools.partial(torch.compile, backend="tpu")
        self.params = {k: p for k, p in model.named_parameters() if p.requires_grad}
        self.state = optimizer.init(self.params)
        self._step_fn = self.compile_fn(self._train_step)

    def _train_step(self, params, buffers, state, args, kwargs, targets):
        def loss_of(p):
            output = torch.func.functional_call(self.model, (p, buffers), args, kwargs)
            if self.compute_loss_fn is None:
                return _loss_from_output(output)
            return self.compute_loss_fn(output, *targets)

        grads, loss = torch.func.grad_and_value(loss_of)(params)
        self.optimizer.step(params, grads, state)
        return loss

    def step(self, inputs: Any, *targets: Any) -> torch.Tensor:
        """One training step on ``inputs`` (see the class docstring); returns the loss, detached."""
        if targets and self.compute_loss_fn is None:
            raise TypeError("SingleTraceTrainer.step: targets were given but compute_loss_fn is None "
                            "(the model's output is taken as the loss)")
        if isinstance(inputs, Mapping):
            args, kwargs = (), dict(inputs)
        elif isinstance(inputs, (tuple, list)):
            args, kwargs = tuple(inputs), {}
        else:
            args, kwargs = (inputs,), {}
        params = {k: p.detach() for k, p in self.params.items()}  # same storage: the update lands in the model
        buffers = {k: b.detach() for k, b in self.model.named_buffers()}
        loss = self._step_fn(params, buffers, self.state, args, kwargs, targets)
        return loss.detach()

