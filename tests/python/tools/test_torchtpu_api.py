"""Our public names and signatures against TorchTPU 0.2's list (torchtpu_api.py): every name is
present with equal parameters and defaults, or listed in NOT_YET and raises NotImplementedError
naming it. NOT_YET is checked as well: a name that lands must leave it."""

import ast
import enum
import importlib
import inspect
import sys
from pathlib import Path

import pytest
import torch

import torch_tpu  # noqa: F401  (registers torch.tpu)

sys.path.insert(0, str(Path(__file__).parent))
from torchtpu_api import API  # noqa: E402

# Names (namespaces or single members) that raise NotImplementedError until their work lands;
# remove an entry when it does (this test then compares its signatures).
NOT_YET: set[str] = set()

CASES = [(ns, name) for ns in sorted(API) for name in sorted(API[ns])]


def _namespace(ns: str):
    """The module ``ns`` as user code reaches it: attribute access from ``torch``."""
    obj = torch
    for part in ns.split(".")[1:]:
        obj = getattr(obj, part)
    return obj


def _resolve(ns: str, name: str):
    return getattr(_namespace(ns), name)


def _pending(ns: str, name: str) -> str | None:
    for qual in (ns, f"{ns}.{name}"):
        if qual in NOT_YET:
            return qual
    return None


def _default_value(node: ast.expr):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ("<expr>", ast.unparse(node))  # a module constant of TorchTPU (EPS, DEFAULT_A, ...)


def _params_from_text(text: str) -> list[tuple[str, str, object]]:
    """(name, kind, default) of a signature as TorchTPU spells it (annotations ignored)."""
    fn = ast.parse(f"def f{text}: pass").body[0]
    a = fn.args
    out = []
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    for i, (arg, d) in enumerate(zip(positional, defaults)):
        kind = "POSITIONAL_ONLY" if i < len(a.posonlyargs) else "POSITIONAL_OR_KEYWORD"
        out.append((arg.arg, kind, inspect.Parameter.empty if d is None else _default_value(d)))
    if a.vararg:
        out.append((a.vararg.arg, "VAR_POSITIONAL", inspect.Parameter.empty))
    for arg, d in zip(a.kwonlyargs, a.kw_defaults):
        out.append((arg.arg, "KEYWORD_ONLY", inspect.Parameter.empty if d is None else _default_value(d)))
    if a.kwarg:
        out.append((a.kwarg.arg, "VAR_KEYWORD", inspect.Parameter.empty))
    if out and out[0][0] == "self":
        out = out[1:]
    return out


def _params_of(obj, rename_default=None) -> list[tuple[str, str, object]]:
    out = []
    for p in inspect.signature(obj).parameters.values():
        d = p.default
        if rename_default and d in rename_default:
            d = rename_default[d]
        out.append((p.name, p.kind.name, d))
    return out


def _same(ours, theirs) -> bool:
    if len(ours) != len(theirs):
        return False
    for (on, ok, od), (tn, tk, td) in zip(ours, theirs):
        if on != tn or ok != tk:
            return False
        if isinstance(td, tuple) and td[:1] == ("<expr>",):
            if od is inspect.Parameter.empty:  # a constant we cannot evaluate: a default must exist
                return False
        elif od != td or type(od) is not type(td):
            return False
    return True


@pytest.mark.parametrize("ns,name", CASES, ids=[f"{ns}.{n}" for ns, n in CASES])
def test_name_matches_torchtpu(ns, name):
    kind, detail = API[ns][name]
    pending = _pending(ns, name)
    if pending is not None:
        with pytest.raises(NotImplementedError, match=pending.replace(".", r"\.")):
            _resolve(ns, name)
        return
    obj = _resolve(ns, name)
    where = f"{ns}.{name}"
    if kind == "enum":
        assert isinstance(obj, enum.EnumMeta), where
        assert sorted(m.name for m in obj) == sorted(detail), where
    elif kind == "property":
        prop = inspect.getattr_static(type(_namespace(ns)), name)
        assert isinstance(prop, property) and prop.fset is not None, f"{where} must be a settable property"
    elif kind == "attribute":
        pass  # present is all the list says
    elif kind == "device":
        cuda = getattr(torch.cuda, name, None)
        if callable(cuda) and callable(obj):
            ours = _params_of(obj, {"tpu": "cuda"})
            assert _same(ours, _params_of(cuda)), f"{where}{inspect.signature(obj)} vs torch.cuda's " \
                                                  f"{inspect.signature(cuda)}"
    else:  # function, class
        assert callable(obj), where
        theirs = _params_from_text(detail)
        ours = _params_of(obj)
        assert _same(ours, theirs), f"{where}: ours {inspect.signature(obj)}, TorchTPU's {detail}"


@pytest.mark.parametrize("qual", sorted(NOT_YET))
def test_not_yet_names_are_missing_for_real(qual):
    """An entry whose module landed must leave NOT_YET (then its signatures get compared)."""
    ns, _, name = qual.rpartition(".")
    try:
        if qual in API:  # a namespace: its module file
            importlib.import_module(f"torch_tpu.{qual[len('torch.'):]}")
        else:
            _resolve(ns, name)
    except NotImplementedError:
        return
    pytest.fail(f"{qual} landed: remove it from NOT_YET")


def test_not_yet_is_part_of_the_list():
    names = set(API) | {f"{ns}.{n}" for ns in API for n in API[ns]}
    assert NOT_YET <= names


def test_a_name_torchtpu_lacks_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no_such_thing"):
        torch.tpu.no_such_thing  # noqa: B018
    assert getattr(torch.tpu, "Scheduling", None) is None  # what Inductor probes on device modules
