"""torch.tpu.profiler: TpuProfilerConfig as torch.profiler's experimental_config (tracer levels,
run_dir in the TensorBoard layout, experimental_options) and on-demand capture (start_server /
stop_server, the ``python -m torch_tpu.profiler capture`` client), on real traces.

The oracle is what the test ran: each trace must hold exactly the ops issued (three aten::mm,
three tpu::mm device events), and the events each level adds or removes.
"""

import collections
import gzip
import inspect
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import warnings

import pytest
import torch
import torch.tpu.profiler
from torch._C._profiler import _ExperimentalConfig
from torch.profiler import ProfilerActivity, profile, record_function, schedule
from torch.tpu.profiler import TpuProfilerConfig

import torch_tpu.profiler as tpu_profiler
from helpers.devices import needs_v6e_8
from torch_tpu.profiler import __main__ as client
from torch_tpu.profiler import server as server_mod

pytestmark = needs_v6e_8

HOST = socket.gethostname()
MMS = 3
LAYOUT = re.compile(r"plugins/profile/\d{4}_\d\d_\d\d_\d\d_\d\d_\d\d(_\d+)?/(?P<file>[^/]+)$")


def _work():
    a = torch.randn(64, 64, device="tpu")
    with record_function("my_range"):
        for _ in range(MMS):
            torch.mm(a, a)
    torch.tpu.synchronize()


def _traces(run_dir):
    """Trace files under run_dir, oldest first, each checked against the layout."""
    found = []
    for root, _, files in os.walk(run_dir):
        for name in files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, run_dir)
            assert LAYOUT.match(rel), rel
            found.append(path)
    return sorted(found, key=os.path.getmtime)


def _events(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def _count(events, cat, name=None):
    return sum(1 for e in events if e.get("cat") == cat and (name is None or e.get("name") == name))


def _outer_ops(events, name):
    """Host ops called ``name`` not nested in another one (a tpu kernel may run the CPU op inside)."""
    ops = [e for e in events if e.get("cat") == "cpu_op" and e["name"] == name]
    return sum(1 for e in ops if not any(
        o is not e and o["tid"] == e["tid"] and o["ts"] <= e["ts"] and e["ts"] + e["dur"] <= o["ts"] + o["dur"]
        for o in ops))


def _profile_once(tmp_path, **config):
    run_dir = tmp_path / "run"
    with profile(experimental_config=TpuProfilerConfig(run_dir=run_dir, **config)) as prof:
        _work()
    (path,) = _traces(run_dir)
    return prof, path, _events(path)


# --- the class ------------------------------------------------------------------------------


def test_namespace_and_signature():
    assert torch.tpu.profiler is sys.modules["torch.tpu.profiler"]
    assert torch.tpu.profiler.TpuProfilerConfig is tpu_profiler.TpuProfilerConfig
    assert {n for n in vars(torch.tpu.profiler) if not n.startswith("_")} == {
        "TpuProfilerConfig", "start_server", "stop_server"}
    assert issubclass(TpuProfilerConfig, _ExperimentalConfig)
    params = inspect.signature(TpuProfilerConfig.__init__).parameters
    assert [(p.name, p.kind, p.default) for p in list(params.values())[1:]] == [
        ("host_tracer_level", inspect.Parameter.KEYWORD_ONLY, 2),
        ("device_tracer_level", inspect.Parameter.KEYWORD_ONLY, 1),
        ("python_tracer_level", inspect.Parameter.KEYWORD_ONLY, 0),
        ("run_dir", inspect.Parameter.KEYWORD_ONLY, None),
        ("worker_rank", inspect.Parameter.KEYWORD_ONLY, None),
        ("experimental_options", inspect.Parameter.KEYWORD_ONLY, None),
        ("check_experimental_options", inspect.Parameter.KEYWORD_ONLY, True),
    ]
    config = TpuProfilerConfig(run_dir="r", worker_rank="4", experimental_options={"gzip": True})
    assert (config.host_tracer_level, config.device_tracer_level, config.python_tracer_level) == (2, 1, 0)
    assert (config.run_dir, config.worker_rank, config.experimental_options) == ("r", "4", {"gzip": True})
    assert "run_dir='r'" in repr(config)


def test_default_levels_write_the_trace_in_the_tensorboard_layout(tmp_path):
    prof, path, events = _profile_once(tmp_path)
    assert os.path.basename(path) == f"{HOST}_{os.getpid()}.pt.trace.json"
    assert _outer_ops(events, "aten::mm") == MMS
    assert _count(events, "user_annotation", "my_range") == 1
    assert _count(events, "kernel", "tpu::mm") == MMS  # device tracks
    assert _count(events, "python_function") == 0
    assert not any("Input Dims" in e.get("args", {}) for e in events)
    # The profile object works as without the config.
    rows = {e.key: e for e in prof.key_averages()}
    assert rows["aten::mm"].count >= MMS and rows["aten::mm"].self_device_time_total > 0


@pytest.mark.parametrize("levels, host_ops, annotations, kernels, python", [
    ({"host_tracer_level": 0}, False, False, True, False),
    ({"host_tracer_level": 1}, False, True, True, False),
    ({"host_tracer_level": 3}, True, True, True, False),
    ({"device_tracer_level": 0}, True, True, False, False),
    ({"python_tracer_level": 1}, True, True, True, True),
    ({"host_tracer_level": 0, "python_tracer_level": 1}, False, False, True, True),
    ({"host_tracer_level": 1, "device_tracer_level": 0}, False, True, False, False),
])
def test_levels_choose_the_events(tmp_path, levels, host_ops, annotations, kernels, python):
    _, _, events = _profile_once(tmp_path, **levels)
    assert _outer_ops(events, "aten::mm") == (MMS if host_ops else 0)
    assert (_count(events, "cpu_op") > 0) == host_ops
    assert _count(events, "user_annotation", "my_range") == (1 if annotations else 0)
    assert _count(events, "kernel", "tpu::mm") == (MMS if kernels else 0)
    processes = [e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"]
    assert any(str(p).startswith("tpu:0 (estimated") for p in processes) == kernels
    python_events = [e["name"] for e in events if e.get("cat") == "python_function"]
    assert any("_work" in n for n in python_events) == python
    if levels.get("host_tracer_level") == 3:
        dims = [e["args"]["Input Dims"] for e in events if e.get("cat") == "cpu_op" and e["name"] == "aten::mm"]
        assert dims.count([[64, 64], [64, 64]]) == MMS  # torch.mm(a, a) (the kernel's mm.out has 3)


def test_levels_override_activities_and_keep_with_stack():
    # Only CPU asked for: the default device level adds the tpu tracks; level 0 removes them.
    with profile(activities=[ProfilerActivity.CPU], experimental_config=TpuProfilerConfig()) as prof:
        _work()
    assert {e.key: e for e in prof.key_averages()}["tpu::mm"].count == MMS
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
                 experimental_config=TpuProfilerConfig(device_tracer_level=0)) as prof:
        _work()
    assert "tpu::mm" not in {e.key for e in prof.key_averages()}
    # python_tracer_level=0 leaves a with_stack=True as it was.
    with profile(with_stack=True, experimental_config=TpuProfilerConfig()) as prof:
        _work()
    assert prof.with_stack
    # Another experimental_config is left alone: CPU only means no device events.
    with profile(activities=[ProfilerActivity.CPU], experimental_config=_ExperimentalConfig()) as prof:
        _work()
    assert "tpu::mm" not in {e.key for e in prof.key_averages()}


def test_worker_rank_gzip_and_one_run_directory_per_trace(tmp_path):
    run_dir = tmp_path / "run"
    config = TpuProfilerConfig(run_dir=str(run_dir), worker_rank="7", experimental_options={"gzip": True})
    for _ in range(2):
        with profile(experimental_config=config):
            _work()
    paths = _traces(run_dir)
    assert len(paths) == 2 and len({os.path.dirname(p) for p in paths}) == 2
    for path in paths:
        assert os.path.basename(path) == f"{HOST}_7.pt.trace.json.gz"
        assert _outer_ops(_events(path), "aten::mm") == MMS


@pytest.mark.filterwarnings("ignore:Warning. Profiler clears events")
def test_each_schedule_cycle_is_written_and_on_trace_ready_still_runs(tmp_path):
    run_dir = tmp_path / "run"
    ready = []
    with profile(schedule=schedule(wait=0, warmup=1, active=1, repeat=2), on_trace_ready=ready.append,
                 experimental_config=TpuProfilerConfig(run_dir=run_dir)) as prof:
        for _ in range(5):
            _work()
            prof.step()
    paths = _traces(run_dir)
    assert len(ready) == 2 and len(paths) == 2
    for path in paths:
        events = _events(path)
        assert _outer_ops(events, "aten::mm") == MMS
        assert _count(events, "kernel", "tpu::mm") == MMS


def test_generation_option_applies_to_this_profiler_only(tmp_path):
    before = tpu_profiler.get_generation()
    _, _, events = _profile_once(tmp_path, experimental_options={"generation": "v5p"})
    names = {e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    assert "tpu:0 (estimated v5p time)" in names
    assert tpu_profiler.get_generation() == before


def test_profile_all_threads_option_records_other_threads():
    stop = threading.Event()
    counts = [0]
    a = torch.randn(64, 64, device="tpu")

    def loop():
        while not stop.is_set():
            torch.mm(a, a).sum().item()
            counts[0] += 1

    def run(options):
        thread = threading.Thread(target=loop)
        stop.clear()
        thread.start()
        try:
            with profile(experimental_config=TpuProfilerConfig(experimental_options=options)) as prof:
                start = counts[0]
                while counts[0] < start + 3:
                    time.sleep(0.01)
        finally:
            stop.set()
            thread.join()
        rows = {e.key: e for e in prof.key_averages()}
        return rows["aten::mm"].count if "aten::mm" in rows else 0

    assert run({"profile_all_threads": True}) >= 3
    assert run({}) == 0  # by default only the thread that started the profiler


def test_trace_only_with_python_tracer_copies_the_config(tmp_path):
    config = TpuProfilerConfig(python_tracer_level=1, run_dir=tmp_path)
    config.trace_only = True
    with pytest.warns(UserWarning, match="trace_only"):
        prof = profile(experimental_config=config)
    assert isinstance(prof.experimental_config, TpuProfilerConfig)
    assert prof.experimental_config is not config and not prof.experimental_config.trace_only
    assert prof.experimental_config.python_tracer_level == 1 and prof.experimental_config.run_dir == str(tmp_path)
    with prof:
        _work()
    (path,) = _traces(tmp_path)
    assert _count(_events(path), "python_function") > 0


@pytest.mark.parametrize("kwargs, error, match", [
    ({"host_tracer_level": "2"}, TypeError, "host_tracer_level must be an int"),
    ({"host_tracer_level": True}, TypeError, "host_tracer_level must be an int"),
    ({"host_tracer_level": 4}, ValueError, "host_tracer_level must be between 0 and 3"),
    ({"device_tracer_level": 2}, ValueError, "device_tracer_level must be between 0 and 1"),
    ({"python_tracer_level": -1}, ValueError, "python_tracer_level must be between 0 and 1"),
    ({"host_tracer_level": 0, "device_tracer_level": 0}, ValueError, "nothing would be traced"),
    ({"run_dir": 3}, TypeError, "run_dir must be a str or os.PathLike"),
    ({"run_dir": ""}, ValueError, "run_dir must be a non-empty path"),
    ({"worker_rank": 1.5}, TypeError, "worker_rank must be a str"),
    ({"worker_rank": "a/b"}, ValueError, "worker_rank 'a/b' cannot be part of a file name"),
    ({"experimental_options": ["gzip"]}, TypeError, "experimental_options must be a mapping"),
    ({"experimental_options": {"gzip": 1}}, TypeError, r"experimental_options\['gzip'\] must be a bool"),
    ({"experimental_options": {"generation": "v9"}}, ValueError, "'v9' is not one of"),
    ({"experimental_options": {"zeta": 1, "alpha": 2}}, ValueError, "unknown experimental_options 'zeta', 'alpha'"),
    ({"check_experimental_options": 1}, TypeError, "check_experimental_options must be a bool"),
])
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        TpuProfilerConfig(**kwargs)
    with profile(experimental_config=TpuProfilerConfig()) as prof:  # the process keeps working
        _work()
    assert {e.key: e for e in prof.key_averages()}["aten::mm"].count >= MMS


def test_run_dir_that_is_a_file_and_unchecked_options(tmp_path):
    file = tmp_path / "f"
    file.write_text("")
    with pytest.raises(ValueError, match="exists and is not a directory"):
        TpuProfilerConfig(run_dir=file)
    with pytest.warns(UserWarning, match="'zeta' have no effect"):
        config = TpuProfilerConfig(experimental_options={"zeta": 1, "gzip": True}, check_experimental_options=False)
    assert config.experimental_options == {"gzip": True}


# --- the capture server, in this process ------------------------------------------------------


@pytest.fixture
def server():
    port = torch.tpu.profiler.start_server(0)
    yield port
    if server_mod.server_address() is not None:
        torch.tpu.profiler.stop_server()


def _get(port, path, timeout=60):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as response:
            return response.status, response.read(), response.headers
    except urllib.error.HTTPError as error:
        return error.code, error.read(), error.headers


def test_server_captures_ops_of_other_threads(server):
    stop = threading.Event()
    a = torch.randn(64, 64, device="tpu")

    def loop():
        while not stop.is_set():
            torch.mm(a, a).sum().item()

    thread = threading.Thread(target=loop)
    thread.start()
    try:
        status, body, headers = _get(server, "/capture?duration_ms=300")
    finally:
        stop.set()
        thread.join()
    assert status == 200
    assert headers["X-TorchTPU-Worker"] == str(os.getpid()) and headers["X-TorchTPU-Host"] == HOST
    events = json.loads(body)["traceEvents"]
    mm = [e for e in events if e.get("cat") == "cpu_op" and e["name"] == "aten::mm"]
    assert thread.native_id in {e["tid"] for e in mm}  # the loop's thread, not the server's
    assert _count(events, "kernel", "tpu::mm") > 0
    status, body, _ = _get(server, "/")
    assert status == 200 and json.loads(body)["pid"] == os.getpid()


def test_server_bad_requests(server):
    for path, status, message in [
        ("/capture", 400, "duration_ms is required"),
        ("/capture?duration_ms=abc", 400, "duration_ms must be an int"),
        ("/capture?duration_ms=0", 400, "duration_ms must be between 1 and 600000"),
        ("/capture?duration_ms=10&host_tracer_level=9", 400, "host_tracer_level must be between 0 and 3"),
        ("/capture?duration_ms=10&colour=red", 400, "unknown parameter"),
        ("/elsewhere", 404, "unknown path"),
    ]:
        code, body, _ = _get(server, path)
        assert code == status and message in json.loads(body)["error"], path
    # A profiler already running in the job: 409, and that profiler is undisturbed.
    with profile(experimental_config=TpuProfilerConfig()) as prof:
        code, body, _ = _get(server, "/capture?duration_ms=10")
        _work()
    assert code == 409 and "already running" in json.loads(body)["error"]
    assert {e.key: e for e in prof.key_averages()}["aten::mm"].count >= MMS
    assert _get(server, "/capture?duration_ms=10")[0] == 200  # still serving


def test_a_profiler_started_during_a_capture_raises(server):
    # Kineto runs one session per process (a second one crashes it): refused until the capture ends.
    result = {}
    request = threading.Thread(target=lambda: result.update(reply=_get(server, "/capture?duration_ms=1500")))
    request.start()
    try:
        deadline = time.monotonic() + 30
        while server_mod._capture_lock.acquire(blocking=False):  # wait for the capture to begin
            server_mod._capture_lock.release()
            assert time.monotonic() < deadline
            time.sleep(0.01)
        busy = _get(server, "/capture?duration_ms=10")
        with pytest.raises(RuntimeError, match="a torch.tpu.profiler capture .* is running"):
            with profile():
                _work()
    finally:
        request.join()
    assert busy[0] == 409 and "a capture is already running" in json.loads(busy[1])["error"]
    assert result["reply"][0] == 200
    with profile() as prof:  # after the capture
        _work()
    assert {e.key: e for e in prof.key_averages()}["aten::mm"].count >= MMS


def test_start_and_stop_errors(server):
    with pytest.raises(RuntimeError, match="already running on port"):
        torch.tpu.profiler.start_server(0)
    torch.tpu.profiler.stop_server()
    with pytest.raises(RuntimeError, match="no profiler server is running"):
        torch.tpu.profiler.stop_server()
    with pytest.raises(TypeError, match="port must be an int"):
        torch.tpu.profiler.start_server("9012")
    with pytest.raises(ValueError, match="port must be between 0 and 65535"):
        torch.tpu.profiler.start_server(70000)
    with pytest.raises(ValueError, match="worker_rank 'a/b'"):
        torch.tpu.profiler.start_server(0, worker_rank="a/b")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}"):
            torch.tpu.profiler.start_server(port)
    with pytest.raises(TypeError, match="duration_ms must be an int"):
        server_mod.capture_trace(1.5)
    with pytest.raises(ValueError, match="duration_ms must be between 1 and 600000"):
        server_mod.capture_trace(600001)
    assert server_mod.server_address() is None
    port = torch.tpu.profiler.start_server(0)  # and it starts again
    assert server_mod.server_address() == ("127.0.0.1", port)


def test_client_errors_in_process(tmp_path, capsys):
    with socket.socket() as s:  # a port with nobody listening
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    assert client.main(["capture", "--port", str(free), "--duration-ms", "10", "--out", str(tmp_path)]) == 1
    assert f"no profiler server at 127.0.0.1:{free}" in capsys.readouterr().err
    for bad in (["--duration-ms", "0"], ["--duration-ms", "ten"], ["--duration-ms", "10", "--port", "0"]):
        args = ["capture", "--port", str(free), "--out", str(tmp_path), *bad]
        with pytest.raises(SystemExit) as exit_info:
            client.main(args)
        assert exit_info.value.code == 2
        assert "--duration-ms" in capsys.readouterr().err or "--port" in bad
    assert not os.listdir(tmp_path)


def test_client_out_that_cannot_hold_a_trace(server, tmp_path, capsys):
    # --out a file: a bad argument (exit 2) before the job is profiled; --out under a file, found only
    # when the trace is written: exit 1 with a message, not a traceback.
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(SystemExit) as exit_info:
        client.main(["capture", "--port", str(server), "--duration-ms", "10", "--out", str(a_file)])
    assert exit_info.value.code == 2
    assert "--out" in capsys.readouterr().err
    under = a_file / "sub"
    assert client.main(["capture", "--port", str(server), "--duration-ms", "10", "--out", str(under)]) == 1
    err = capsys.readouterr().err
    assert f"cannot write the trace under {under}" in err and "Traceback" not in err
    assert client.main(["capture", "--port", str(server), "--duration-ms", "10", "--out", str(tmp_path / "ok")]) == 0


# --- a job in another process, captured by the shipped client ---------------------------------

JOB = """
import sys, torch
import torch.tpu.profiler
port = torch.tpu.profiler.start_server(0, worker_rank="5")
print(port, flush=True)
a = torch.randn(128, 128, device="tpu")
import select
while not select.select([sys.stdin], [], [], 0)[0]:
    torch.mm(a, a).sum().item()
torch.tpu.profiler.stop_server()
print("stopped", flush=True)
"""


def _env():
    return {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_TPU_", "TPU_"))}


@pytest.fixture(scope="module")
def job():
    proc = subprocess.Popen([sys.executable, "-c", JOB], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env())
    port = int(proc.stdout.readline())
    yield proc, port
    out, err = proc.communicate("stop\n", timeout=120)
    assert proc.returncode == 0 and "stopped" in out, err[-3000:]


def test_client_captures_a_job_in_another_process(job, tmp_path):
    proc, port = job
    out = tmp_path / "captures"
    result = subprocess.run(
        [sys.executable, "-m", "torch_tpu.profiler", "capture", "--port", str(port), "--duration-ms", "300",
         "--out", str(out)], capture_output=True, text=True, env=_env(), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    (path,) = _traces(out)
    assert result.stdout.strip() == path
    assert os.path.basename(path) == f"{HOST}_5.pt.trace.json"
    events = _events(path)
    pids = {e["pid"] for e in events if e.get("cat") == "cpu_op" and e["name"] == "aten::mm"}
    assert pids == {proc.pid}  # the job's ops, not the client's
    assert _count(events, "kernel", "tpu::mm") > 0


def test_client_levels_gzip_and_refusals_against_the_job(job, tmp_path, capsys):
    _, port = job
    out = str(tmp_path)
    args = ["capture", "--port", str(port), "--duration-ms", "200", "--out", out]
    assert client.main([*args, "--device-tracer-level", "0", "--host-tracer-level", "1", "--gzip"]) == 0
    (path,) = _traces(out)
    assert path.endswith(f"{HOST}_5.pt.trace.json.gz")
    events = _events(path)
    assert _count(events, "kernel") == 0 and _count(events, "cpu_op") == 0
    counts = collections.Counter(e.get("ph") for e in events)
    assert counts["M"] > 0  # a real, if quiet, trace
    capsys.readouterr()
    assert client.main([*args, "--host-tracer-level", "7"]) == 1
    assert "refused: TpuProfilerConfig: host_tracer_level must be between 0 and 3" in capsys.readouterr().err
    assert len(_traces(out)) == 1


def test_no_warnings_from_a_plain_config():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TpuProfilerConfig(run_dir="somewhere")


def test_start_server_inside_a_running_profile_leaves_it_recording():
    # start_server's warm-up profile must not end the user's session (its events were all lost).
    with profile() as prof:
        _work()
        port = torch.tpu.profiler.start_server(0)
        _work()
    try:
        assert {e.key: e for e in prof.key_averages()}["aten::mm"].count >= 2 * MMS
        assert _get(port, "/capture?duration_ms=10")[0] == 200  # and the server captures afterwards
    finally:
        torch.tpu.profiler.stop_server()
