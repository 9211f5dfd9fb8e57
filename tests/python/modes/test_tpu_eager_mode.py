"""TorchTPU's eager-mode API: torch.tpu.EagerMode, the torch.tpu.eager_mode property,
torch.tpu.set_eager_mode(...) as a context manager; torch.tpu.allow_excess_precision."""

import threading
import warnings

import pytest
import torch

import torch_tpu
import torch_tpu.debug

M = torch.tpu.EagerMode


@pytest.fixture(autouse=True)
def _strict_around():
    assert torch_tpu.get_eager_mode() == "strict"
    yield
    torch_tpu.set_eager_mode("strict")


def _recorded():
    return torch_tpu.debug.region_stats()["ops_recorded"]


def test_members_map_onto_our_mode_names():
    assert {m.name: m.value for m in M} == {
        "DEFER_AND_FUSE": "defer_and_fuse", "DEFER_NEVER": "strict", "DEFER_NEVER_AND_LAUNCH_BLOCKING": "debug"}


def test_property_reads_and_assigns_the_real_mode():
    assert torch.tpu.eager_mode is M.DEFER_NEVER
    torch.tpu.eager_mode = M.DEFER_AND_FUSE
    assert torch_tpu.get_eager_mode() == "defer_and_fuse" and torch.tpu.eager_mode is M.DEFER_AND_FUSE
    before = _recorded()
    x = torch.ones(64, device="tpu")
    y = (x + 1) * 2
    assert _recorded() - before == 2 and torch_tpu.debug.pending_ops() > 0  # recorded, not run
    torch.tpu.eager_mode = M.DEFER_NEVER  # leaving the mode issues what it recorded
    assert torch_tpu.debug.pending_ops() == 0
    assert torch.equal(y.cpu(), torch.full((64,), 4.0))
    before = _recorded()
    _ = x + 1
    assert _recorded() == before  # strict again: nothing recorded
    # the string API sees the same setting, both ways
    torch_tpu.set_eager_mode("debug")
    assert torch.tpu.eager_mode is M.DEFER_NEVER_AND_LAUNCH_BLOCKING


def test_set_eager_mode_is_a_context_manager_that_restores():
    torch.tpu.eager_mode = M.DEFER_AND_FUSE
    x = torch.arange(8.0, device="tpu")
    with torch.tpu.set_eager_mode(M.DEFER_NEVER_AND_LAUNCH_BLOCKING):
        assert torch_tpu.get_eager_mode() == "debug"
        assert torch_tpu.debug.pending_ops() == 0
        with pytest.raises(IndexError, match="index_select"):  # debug mode's check, at the op
            torch.index_select(x, 0, torch.tensor([9], device="tpu"))
        with torch.tpu.set_eager_mode(M.DEFER_NEVER):
            assert torch.tpu.eager_mode is M.DEFER_NEVER
        assert torch.tpu.eager_mode is M.DEFER_NEVER_AND_LAUNCH_BLOCKING
    assert torch.tpu.eager_mode is M.DEFER_AND_FUSE
    with pytest.raises(KeyError):
        with torch.tpu.set_eager_mode(M.DEFER_NEVER):
            raise KeyError("boom")
    assert torch.tpu.eager_mode is M.DEFER_AND_FUSE


def test_leaving_defer_and_fuse_issues_its_work():
    x = torch.ones(16, device="tpu")
    before = _recorded()
    with torch.tpu.set_eager_mode(M.DEFER_AND_FUSE):
        y = x * 3 + 1
        assert torch_tpu.debug.pending_ops() > 0
    assert _recorded() - before == 2 and torch_tpu.debug.pending_ops() == 0
    assert torch.equal(y.cpu(), torch.full((16,), 4.0))


def test_the_block_is_process_wide_so_backward_follows_it():
    """Backward ops run on the autograd engine's tpu thread: a process-wide mode reaches them."""
    seen = {}
    x = torch.randn(32, device="tpu", requires_grad=True)
    with torch.tpu.set_eager_mode(M.DEFER_AND_FUSE):
        t = threading.Thread(target=lambda: seen.setdefault("other", torch.tpu.eager_mode))
        t.start()
        t.join()
        y = torch.nn.functional.gelu(x).sum()
        before = _recorded()
        y.backward()
        backward_recorded = _recorded() - before
    assert seen["other"] is M.DEFER_AND_FUSE
    assert backward_recorded > 0
    xc = x.detach().cpu().requires_grad_()
    torch.nn.functional.gelu(xc).sum().backward()
    torch.testing.assert_close(x.grad.cpu(), xc.grad)


def test_inside_a_thread_local_block_it_sets_that_block():
    with torch_tpu.eager_mode("debug"):
        torch.tpu.eager_mode = M.DEFER_AND_FUSE
        assert torch.tpu.eager_mode is M.DEFER_AND_FUSE  # what is assigned is what is read back
        with torch.tpu.set_eager_mode(M.DEFER_NEVER):
            assert torch_tpu.get_eager_mode() == "strict"
        assert torch_tpu.get_eager_mode() == "defer_and_fuse"
        assert torch_tpu._C._get_eager_mode() == "strict"  # the process-wide mode never moved
    assert torch.tpu.eager_mode is M.DEFER_NEVER


def test_the_string_api_takes_the_enum_too():
    torch_tpu.set_eager_mode(M.DEFER_NEVER_AND_LAUNCH_BLOCKING)
    assert torch_tpu.get_eager_mode() == "debug"
    torch_tpu.set_eager_mode("strict")
    with torch_tpu.eager_mode(M.DEFER_AND_FUSE):
        assert torch_tpu.get_eager_mode() == "defer_and_fuse"
    assert torch_tpu.get_eager_mode() == "strict"


def test_a_bare_call_changes_nothing_and_says_so():
    with pytest.warns(UserWarning, match="is a context manager and changed nothing"):
        torch.tpu.set_eager_mode(M.DEFER_AND_FUSE)
    assert torch.tpu.eager_mode is M.DEFER_NEVER
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.tpu.set_eager_mode(M.DEFER_NEVER):
            pass


@pytest.mark.parametrize("bad", ["strict", "DEFER_NEVER", 0, None, torch.tpu.Precision.HIGH])
def test_wrong_enum_values_name_the_argument(bad):
    msg = r"mode must be a torch\.tpu\.EagerMode \(DEFER_AND_FUSE, DEFER_NEVER, DEFER_NEVER_AND_LAUNCH_BLOCKING\)"
    with pytest.raises(TypeError, match=r"torch\.tpu\.set_eager_mode: " + msg):
        torch.tpu.set_eager_mode(bad)
    with pytest.raises(TypeError, match=r"torch\.tpu\.eager_mode: " + msg):
        torch.tpu.eager_mode = bad
    assert torch.tpu.eager_mode is M.DEFER_NEVER
    assert torch.equal((torch.ones(4, device="tpu") + 1).cpu(), torch.full((4,), 2.0))  # keeps working


@pytest.mark.parametrize("fullgraph", [False, True])
def test_set_eager_mode_inside_a_compiled_function_raises(fullgraph):
    torch._dynamo.reset()

    def f(x):
        with torch.tpu.set_eager_mode(M.DEFER_AND_FUSE):
            return x + 1

    x = torch.ones(4, device="tpu")
    with pytest.raises(RuntimeError, match="set_eager_mode") as info:
        torch.compile(f, backend="tpu", fullgraph=fullgraph)(x)
    if not fullgraph:  # with fullgraph Dynamo reports it as its own Unsupported (a RuntimeError)
        assert "cannot change inside a compiled region" in str(info.value)
    assert torch.tpu.eager_mode is M.DEFER_NEVER

    def g(x):
        torch.tpu.eager_mode = M.DEFER_AND_FUSE
        return x + 1

    torch._dynamo.reset()
    with pytest.raises(RuntimeError, match="eager_mode"):
        torch.compile(g, backend="tpu", fullgraph=fullgraph)(x)
    assert torch.tpu.eager_mode is M.DEFER_NEVER
    # the same mode change around the compiled call is fine
    with torch.tpu.set_eager_mode(M.DEFER_NEVER_AND_LAUNCH_BLOCKING):
        assert torch.equal(torch.compile(lambda x: x * 2, backend="tpu")(x).cpu(), torch.full((4,), 2.0))


def test_allow_excess_precision_is_a_stored_flag_that_changes_no_result():
    assert torch.tpu.allow_excess_precision is True  # XLA's default
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=g).to(torch.bfloat16)
    y = torch.randn(4096, generator=g).to(torch.bfloat16)

    def chain(a, b):
        return (a * b + b) * a - b

    per_op = chain(x, y)  # eager CPU: every ATen op rounds to bf16
    excess = chain(x.float(), y.float()).to(torch.bfloat16)  # f32 intermediates, one rounding
    assert not torch.equal(per_op, excess)  # the oracle tells the two apart
    before = torch_tpu.debug.region_stats()["kernels_launched"]
    try:
        for allowed in (True, False):
            torch.tpu.allow_excess_precision = allowed
            assert torch.tpu.allow_excess_precision is allowed
            with torch.tpu.set_eager_mode(M.DEFER_AND_FUSE):
                got = chain(x.tpu(), y.tpu()).cpu()
            assert torch.equal(got, per_op)  # fused, and rounded where eager rounds, either way
    finally:
        torch.tpu.allow_excess_precision = True
    assert torch_tpu.debug.region_stats()["kernels_launched"] > before  # it did run fused kernels


@pytest.mark.parametrize("bad", [1, 0, "yes", None])
def test_allow_excess_precision_takes_a_bool_only(bad):
    with pytest.raises(TypeError, match=r"torch\.tpu\.allow_excess_precision: value must be a bool"):
        torch.tpu.allow_excess_precision = bad
    assert torch.tpu.allow_excess_precision is True
