"""torch.compile on tpu without backend="tpu", torch.compile's options, custom_compiler_options,
async_compile / resolve_compilations: results against CPU eager, counters, bad input."""

import glob
import inspect
import os
import threading
import uuid
import warnings

import pytest
import torch

import torch_tpu
from helpers.fx_graphs import uncacheable_graph
from torch_tpu.compile import background, graph_compiler
from torch_tpu.compile import cache as program_cache
from torch_tpu.compile import options as compile_options
from torch_tpu.compile.dynamic import bucket_stats, reset_bucket_stats


@pytest.fixture(autouse=True)
def fresh(tmp_path, monkeypatch):
    """Each test: its own cache folder, no programs from earlier tests, zeroed counters."""
    monkeypatch.setenv("TORCH_TPU_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TORCH_TPU_DUMP_IR", raising=False)
    torch._dynamo.reset()
    program_cache.clear_memory_cache()
    torch_tpu.reset_compile_stats()
    reset_bucket_stats()
    yield
    torch_tpu.resolve_compilations()
    torch._dynamo.reset()


def close(a, b, atol=1e-6, rtol=1e-6):
    torch.testing.assert_close(a.detach().cpu(), b.detach().cpu(), atol=atol, rtol=rtol)


def _fn(x, y):
    return (x * 2 + y).sin().sum(0)


@pytest.fixture
def inductor_spy(monkeypatch):
    """Inductor's compile_fx replaced by a recorder that runs the graph as it is: which graphs
    reach Inductor, without paying for a C++ compilation."""
    import torch._inductor.compile_fx as cfx

    seen = []

    def spy(gm, example_inputs, *args, **kwargs):
        seen.append({x.device.type for x in example_inputs if isinstance(x, torch.Tensor)})
        return gm.forward

    monkeypatch.setattr(cfx, "compile_fx", spy)
    return seen


# ---------------------------------------------------------------- backend choice


@pytest.mark.parametrize("backend", [None, "inductor"])
def test_default_and_inductor_backend_on_tpu_use_the_tpu_backend(backend, inductor_spy):
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    f = torch.compile(_fn) if backend is None else torch.compile(_fn, backend=backend)
    close(f(x.to("tpu"), y.to("tpu")), _fn(x, y))
    s = torch_tpu.compile_stats()
    assert s["routed_from_inductor"] == 1 and s["left_to_inductor"] == 0
    assert s["compilations"] == 1 and s["programs_run"] == 1
    assert inductor_spy == []


def test_training_step_through_default_backend_matches_cpu():
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    dev = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    dev.load_state_dict(ref.state_dict())
    dev.to("tpu")
    x = torch.randn(4, 8)
    ref(x).square().mean().backward()
    torch.compile(dev)(x.to("tpu")).square().mean().backward()
    for p, q in zip(ref.parameters(), dev.parameters()):
        close(q.grad, p.grad, atol=1e-6, rtol=1e-5)
    s = torch_tpu.compile_stats()
    assert s["routed_from_inductor"] == 1 and s["graphs"] == 2  # forward and backward


def test_guard_failures_of_the_default_backend_are_recorded():
    f = torch.compile(lambda t: t * 2)
    for dtype in (torch.float32, torch.float64):
        x = torch.randn(3, dtype=dtype)
        close(f(x.to("tpu")), x * 2)
    s = torch_tpu.compile_stats()
    assert s["routed_from_inductor"] == 2
    assert any("dtype" in r for r in s["recompile_reasons"])


def test_cpu_graph_keeps_inductor(inductor_spy):
    x = torch.randn(3)
    close(torch.compile(lambda t: t + 1)(x), x + 1)
    assert inductor_spy == [{"cpu"}]
    s = torch_tpu.compile_stats()
    assert s["left_to_inductor"] == 1 and s["routed_from_inductor"] == 0 and s["graphs"] == 0


def test_dynamo_optimize_inductor_routes_by_device(inductor_spy):
    x = torch.randn(3)
    close(torch._dynamo.optimize("inductor")(lambda t: t * 3)(x.to("tpu")), x * 3)
    torch._dynamo.reset()
    close(torch._dynamo.optimize("inductor")(lambda t: t * 4)(x), x * 4)
    s = torch_tpu.compile_stats()
    assert s["routed_from_inductor"] == 1 and s["left_to_inductor"] == 1
    assert inductor_spy == [{"cpu"}]


def test_mixed_cpu_tpu_graph_and_tpu_factories_go_to_the_tpu_backend(inductor_spy):
    x, y = torch.randn(4, 4), torch.randn(4, 4)

    def mixed(a, b_cpu):
        return (a + b_cpu.to("tpu")) * 3, b_cpu * 2

    out_tpu, out_cpu = torch.compile(mixed)(x.to("tpu"), y)
    assert out_tpu.device.type == "tpu" and out_cpu.device.type == "cpu"
    close(out_tpu, (x + y) * 3)
    close(out_cpu, y * 2)
    ones = torch.compile(lambda: torch.ones(3, device="tpu") * 2)()  # no input: the values decide
    assert ones.device.type == "tpu"
    close(ones, torch.full((3,), 2.0))
    assert torch_tpu.compile_stats()["routed_from_inductor"] == 2 and inductor_spy == []


def test_inductor_codegen_for_tpu_names_backend_tpu():
    """Inductor reached directly (not through torch.compile) on tpu: a clear error, not Pallas's
    ModuleNotFoundError for jax."""
    import torch._inductor.compile_fx as cfx

    gm = torch.fx.symbolic_trace(lambda t: t * 2 + 1)
    with pytest.raises(Exception, match=r"Inductor cannot generate code for tpu.*backend='tpu'"):
        cfx.compile_fx(gm, [torch.randn(3, device="tpu")])
    x = torch.randn(3)
    close(torch.compile(lambda t: t * 2 + 1)(x.to("tpu")), x * 2 + 1)  # still works


def test_inductor_options_on_a_tpu_graph_are_recorded_as_ignored():
    x = torch.randn(5)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        f = torch.compile(lambda t: t.exp(), options={"epilogue_fusion": False, "bucket_size": 8})
        close(f(x.to("tpu")), x.exp())
    s = torch_tpu.compile_stats()
    assert s["ignored_compiler_options"] == {"epilogue_fusion": 1}
    assert s["routed_from_inductor"] == 1


# ---------------------------------------------------------------- torch.compile options


def test_name_and_debug_callback_see_fx_graphs_and_stablehlo(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_TPU_DUMP_IR", str(tmp_path / "dump"))
    seen = []

    def cb(graphs, stablehlo):
        seen.append(([type(g).__name__ for g in graphs], stablehlo))

    f = torch.compile(lambda t: (t * t).sum(), backend="tpu", options={"name": "tiny", "debug_callback": cb})
    x = torch.randn(6, requires_grad=True)
    xt = x.detach().to("tpu").requires_grad_()
    f(xt).backward()
    (x * x).sum().backward()
    close(xt.grad, x.grad)
    assert [g for g, _ in seen] == [["GraphModule", "GraphModule"]] * 2  # Dynamo's graph, the ATen graph
    texts = [t for _, t in seen]
    assert any("module @tiny_forward_" in t for t in texts) and any("module @tiny_backward_" in t for t in texts)
    assert all("func.func @main" in t for t in texts)
    dumped = sorted(os.path.basename(p) for p in glob.glob(str(tmp_path / "dump" / "*.mlir")))
    assert [p.split("_")[:2] for p in dumped] == [["program", "tiny"]] * 2


def test_bucket_size_and_num_dynamic_buckets():
    f = torch.compile(lambda t: t.sum(1) * 2, backend="tpu", dynamic=True,
                      options={"bucket_size": 8, "num_dynamic_buckets": 2})
    for n in (3, 5, 12, 20):  # buckets 8, 8, 16; 20 is past the last one: exact
        x = torch.randn(2, n)
        close(f(x.to("tpu")), x.sum(1) * 2, atol=1e-5, rtol=1e-5)
    b = bucket_stats()
    assert b["bucket_compilations"] == 2 and b["exact_compilations"] == 1
    assert any("past the largest bucket 16" in r for r in b["reasons"])


def test_bucket_configs_from_options():
    bc = compile_options.CompileOptions
    assert bc(bucket_size=8).bucket_config().bucket(17) == 24
    assert bc(bucket_size=8, num_dynamic_buckets=3).bucket_config().sizes == (8, 16, 24)
    four = compile_options.parse_buckets("4,16,+16")
    assert bc(num_dynamic_buckets=4, buckets=four).bucket_config().sizes == (4, 16, 32, 48)
    assert bc(num_dynamic_buckets=3, buckets=compile_options.parse_buckets("off")).bucket_config().sizes == (1, 2, 4)
    assert bc().bucket_config() is None  # the configuration in force at each call


def test_serializable():
    gm, xt = uncacheable_graph()
    with pytest.raises(RuntimeError, match="serializable.*inference program cannot be serialized.*slice"):
        graph_compiler.compile_fx_graph(gm, [xt.to("tpu")], "inference",
                                        compile_options.CompileOptions(serializable=True))
    run = graph_compiler.compile_fx_graph(gm, [xt.to("tpu")], "inference")  # not asked: runs uncached
    close(run([xt.to("tpu")])[0], (xt * 2)[0:2])
    f = torch.compile(lambda t: t.cos() + 1, backend="tpu", options={"serializable": True})
    close(f(xt.to("tpu")), xt.cos() + 1)
    assert len(glob.glob(os.path.join(program_cache.cache_dir(), "*.json"))) == 1


def _block_compile_thread():
    """Hold the compile thread until the returned event is set (builds queue behind)."""
    release = threading.Event()
    art = background.submit(release.wait, "test blocker")
    return release, art


def test_async_compile_option_runs_op_by_op_until_the_program_is_ready():
    f = torch.compile(lambda t: (t * 3).exp().sum(1), backend="tpu", options={"async_compile": True})
    x = torch.randn(8, 16)
    release, _ = _block_compile_thread()
    try:
        close(f(x.to("tpu")), (x * 3).exp().sum(1), rtol=1e-5, atol=1e-5)
        assert torch_tpu.compile_stats()["programs_run"] == 0  # the graph ran op by op
    finally:
        release.set()
    torch_tpu.resolve_compilations()
    close(f(x.to("tpu")), (x * 3).exp().sum(1), rtol=1e-5, atol=1e-5)
    s = torch_tpu.compile_stats()
    assert s["programs_run"] == 1 and s["async_builds"] == 1 and s["compilations"] == 1


def test_async_compile_option_build_error_is_raised(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("boom in the builder")

    monkeypatch.setattr(graph_compiler, "build_description", broken)
    f = torch.compile(lambda t: t.exp() + 1, backend="tpu", options={"async_compile": True})
    x = torch.randn(4)
    release, _ = _block_compile_thread()
    try:
        close(f(x.to("tpu")), x.exp() + 1)  # before the build ran: op by op
    finally:
        release.set()
    with pytest.raises(RuntimeError, match="boom in the builder"):
        torch_tpu.resolve_compilations()
    torch_tpu.resolve_compilations()  # reported once: nothing left
    with pytest.raises(RuntimeError, match="boom in the builder"):
        f(x.to("tpu"))  # every later call of that program


@pytest.mark.parametrize("opts,exc,match", [
    ({"bogus": 1}, ValueError, "unknown option 'bogus'.*num_dynamic_buckets"),
    ({"bucket_size": "8"}, TypeError, "'bucket_size' must be an int"),
    ({"num_dynamic_buckets": 0}, ValueError, "'num_dynamic_buckets' must be >= 1"),
    ({"async_compile": 1}, TypeError, "'async_compile' must be a bool"),
    ({"serializable": "yes"}, TypeError, "'serializable' must be a bool"),
    ({"debug_callback": 5}, TypeError, "'debug_callback' must be callable"),
    ({"name": ""}, TypeError, "'name' must be a non-empty str"),
])
def test_bad_options(opts, exc, match):
    x = torch.randn(3)
    with pytest.raises(exc, match=match):
        torch.compile(lambda t: t + 1, backend="tpu", options=opts)(x.to("tpu"))
    if "bogus" not in opts:  # Inductor rejects names it does not know itself
        with pytest.raises(exc, match=match):
            torch.compile(lambda t: t + 1, options=opts)
    torch._dynamo.reset()
    close(torch.compile(lambda t: t + 2, backend="tpu")(x.to("tpu")), x + 2)  # still works


def test_options_that_are_not_a_dict():
    # torch.compile without backend= (or backend="inductor"): our wrapper reads options first; a
    # list must not fail there with "AttributeError: 'list' object has no attribute 'items'".
    for bad in ([("name", "a")], "name=a"):
        with pytest.raises(TypeError, match=r"torch.compile: options must be a dict, got (list|str)"):
            torch.compile(lambda t: t + 1, options=bad)
    x = torch.randn(3)
    close(torch.compile(lambda t: t + 3, options={"name": "ok"})(x.to("tpu")), x + 3)  # still works


# ---------------------------------------------------------------- custom_compiler_options


def test_custom_compiler_options_signature():
    assert str(inspect.signature(torch.tpu.compiler.custom_compiler_options)) == "(options: dict[str, str])"
    assert [n for n in dir(torch.tpu.compiler) if not n.startswith("_")] == ["custom_compiler_options"]


def test_unknown_xla_options_are_recorded_and_warned_once():
    name = f"xla_test_flag_{uuid.uuid4().hex[:8]}"
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for _ in range(2):
            with torch.tpu.compiler.custom_compiler_options({name: "true", "xla_disable_hlo_passes": "cse"}):
                pass
    mine = [str(x.message) for x in w if name in str(x.message)]
    assert len(mine) == 1 and "ignored" in mine[0] and "ignored_compiler_options" in mine[0]
    assert w[0].filename == __file__  # points at the with statement
    ignored = torch_tpu.compile_stats()["ignored_compiler_options"]
    assert ignored == {name: 2, "xla_disable_hlo_passes=cse": 2}
    torch_tpu.reset_compile_stats()
    assert torch_tpu.compile_stats()["ignored_compiler_options"] == {}


def test_fusion_off_and_single_op_regions_change_the_program():
    x = torch.randn(4, 8)

    def f(t):
        return (t + 1).exp() * 2

    with torch.tpu.compiler.custom_compiler_options({"xla_disable_hlo_passes": "fusion"}):
        close(torch.compile(f, backend="tpu")(x.to("tpu")), f(x), rtol=1e-5, atol=1e-6)
    s = torch_tpu.compile_stats()
    assert s["regions"] == 0 and s["library_calls"].get("aten::exp.default") == 1
    torch._dynamo.reset()
    torch_tpu.reset_compile_stats()
    close(torch.compile(f, backend="tpu")(x.to("tpu")), f(x), rtol=1e-5, atol=1e-6)  # outside: fused again
    s = torch_tpu.compile_stats()
    assert s["regions"] == 1 and s["compilations"] == 1 and s["cache_hits_memory"] == 0

    def single(t):
        return t.exp()

    for value, regions in (("0", 0), ("true", 1)):
        torch._dynamo.reset()
        torch_tpu.reset_compile_stats()
        with torch.tpu.compiler.custom_compiler_options({"torch_tpu_compile_single_op_regions": value}):
            close(torch.compile(single, backend="tpu")(x.to("tpu")), x.exp(), rtol=1e-5, atol=1e-6)
        assert torch_tpu.compile_stats()["regions"] == regions


def test_xla_dump_to_and_buckets_in_the_context(tmp_path):
    f = torch.compile(lambda t: t.sum(1), backend="tpu", dynamic=True)
    opts = {"xla_dump_to": str(tmp_path), "torch_tpu_compile_buckets": "4,+4"}
    with torch.tpu.compiler.custom_compiler_options(opts):
        with torch.tpu.compiler.custom_compiler_options({"torch_tpu_compile_buckets": "6,+6"}):  # inner wins
            x = torch.randn(2, 5)
            close(f(x.to("tpu")), x.sum(1), atol=1e-5, rtol=1e-5)
    assert compile_options.effective() == compile_options.CompileOptions()  # restored on exit
    assert any("=5->6" in r for r in bucket_stats()["reasons"])
    assert glob.glob(str(tmp_path / "program_*.mlir"))


@pytest.mark.parametrize("opts,exc,match", [
    (["xla_dump_to"], TypeError, "options must be a dict"),
    ({1: "x"}, TypeError, "option names must be str, got 1"),
    ({"xla_dump_to": 3}, TypeError, "option 'xla_dump_to' must have a str value"),
    ({"xla_dump_to": ""}, ValueError, "'xla_dump_to' needs a folder"),
    ({"torch_tpu_compile_single_op_regions": "yes"}, ValueError, "'torch_tpu_compile_single_op_regions' must be"),
    ({"torch_tpu_compile_buckets": "8,4"}, ValueError, "'torch_tpu_compile_buckets'.*ascending"),
    ({"torch_tpu_compile_bucket": "8"}, ValueError, "unknown option 'torch_tpu_compile_bucket'"),
])
def test_custom_compiler_options_bad_input(opts, exc, match):
    name = f"xla_test_flag_{uuid.uuid4().hex[:8]}"
    if isinstance(opts, dict):
        opts = {name: "1", **opts}
    with pytest.raises(exc, match=match):
        with torch.tpu.compiler.custom_compiler_options(opts):
            pass
    assert torch_tpu.compile_stats()["ignored_compiler_options"] == {}  # nothing recorded
    assert compile_options.effective() == compile_options.CompileOptions()
    with torch.tpu.compiler.custom_compiler_options({"xla_disable_hlo_passes": ""}):
        assert compile_options.effective().fuse


# ---------------------------------------------------------------- async_compile / resolve_compilations


def test_async_compile_then_calls_compile_nothing():
    f = torch.compile(lambda t: t.tanh() * 2, backend="tpu", dynamic=False)
    a, b = torch.randn(3, 5), torch.randn(6, 5)
    art = torch_tpu.async_compile(f, [(a.to("tpu"),), b.to("tpu")])
    torch_tpu.resolve_compilations([art])
    assert art.done() and art.error is None and "2 warmup inputs" in repr(art)
    assert torch_tpu.compile_stats()["compilations"] == 2
    torch_tpu.reset_compile_stats()
    close(f(a.to("tpu")), a.tanh() * 2)
    close(f(b.to("tpu")), b.tanh() * 2)
    s = torch_tpu.compile_stats()
    assert s["compilations"] == 0 and s["graphs"] == 0 and s["programs_run"] == 2


def test_async_compile_error_is_raised_by_resolve():
    f = torch.compile(lambda t: t @ t, backend="tpu")
    art = torch_tpu.async_compile(f, [torch.randn(2, 2, device="tpu"), torch.randn(3, 5, device="tpu")])
    with pytest.raises(RuntimeError) as e:
        torch_tpu.resolve_compilations(art)
    assert any("warmup_inputs[1] (float32[3, 5] on tpu:0)" in n for n in getattr(e.value, "__notes__", []))
    assert isinstance(art.error, RuntimeError)
    torch_tpu.resolve_compilations()  # reported: not pending any more
    x = torch.randn(2, 2)
    close(f(x.to("tpu")), x @ x)


def test_resolve_timeout():
    release, art = _block_compile_thread()
    try:
        with pytest.raises(TimeoutError, match="still running after 0.05 s: test blocker"):
            torch_tpu.resolve_compilations([art], timeout=0.05)
    finally:
        release.set()
    torch_tpu.resolve_compilations([art])


@pytest.mark.parametrize("fn,inputs,exc,match", [
    (5, [(1,)], TypeError, "fn must be callable"),
    (lambda t: t, [(1,)], TypeError, "is not compiled"),
    (None, [], ValueError, "warmup_inputs is empty"),
    (None, torch.ones(2), TypeError, "warmup_inputs must be a sequence"),
    (None, [5], TypeError, r"warmup_inputs\[0\] must be a tuple"),
])
def test_async_compile_bad_input(fn, inputs, exc, match):
    if fn is None:
        fn = torch.compile(lambda t: t, backend="tpu")
    with pytest.raises(exc, match=match):
        torch_tpu.async_compile(fn, inputs)


def test_resolve_compilations_bad_input():
    with pytest.raises(TypeError, match="artifacts must be a CompileArtifact"):
        torch_tpu.resolve_compilations(5)
    with pytest.raises(TypeError, match=r"artifacts\[0\] is a str"):
        torch_tpu.resolve_compilations(["x"])
    # timeout is checked whether or not anything is pending (it was only used, and then failed
    # deep in concurrent.futures, when a compilation was still running)
    for bad in ("1", [1]):
        with pytest.raises(TypeError, match="resolve_compilations: timeout must be None or a number of seconds"):
            torch_tpu.resolve_compilations(timeout=bad)
    with pytest.raises(ValueError, match="resolve_compilations: timeout must be >= 0, got -1"):
        torch_tpu.resolve_compilations(timeout=-1)
    torch_tpu.resolve_compilations(timeout=0)  # nothing pending: returns
