#!/usr/bin/env python3
"""OpInfo conformance matrix of torch_tpu: PyTorch's op_db on tpu against CPU.

Runs every (op, dtype, kind) case of tests/python/helpers/opinfo_harness.py -- dtypes
float32, bfloat16, int64, bool; kinds forward, grad, noncontig, out -- and
prints, per dtype and kind, how many ops passed / failed / were skipped (the
skip file tests/python/helpers/opinfo_skips.py). Cases that do not exist (dtype not
supported by the op, no out= variant, no autograd) are not counted. Writes the
same figures plus every failure to conformance.json.

Cases run in a worker process; one that crashes it or runs past --timeout
seconds is recorded as failed and a fresh worker continues with the next case.

    python scripts/conformance.py                 # whole matrix
    python scripts/conformance.py --ci            # the CI shard (tests/python/ops/test_opinfo.py default)
    python scripts/conformance.py --ops add,mul --kinds forward,out --no-skips
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import selectors
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests", "python")
sys.path.insert(0, TESTS)  # the test helpers package: helpers.opinfo_harness


# ------------------------------------------------------------------ worker

def worker(result_fd: int) -> None:
    """Reads one JSON case per stdin line, writes one JSON result per line to result_fd."""
    import torch_tpu  # noqa: F401  (also when TORCH_DEVICE_BACKEND_AUTOLOAD=0)
    from helpers import opinfo_harness as H

    skips = None if os.environ.get("CONFORMANCE_NO_SKIPS") else H.load_skips()
    out = os.fdopen(result_fd, "w", buffering=1)
    out.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        name, dtype, kind, max_samples = json.loads(line)
        r = H.run_case(name, dtype, kind, max_samples or None, skips)
        out.write(json.dumps(r.__dict__) + "\n")


class Worker:
    def __init__(self, log):
        rfd, wfd = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", str(wfd)],
            stdin=subprocess.PIPE, stdout=log, stderr=log, pass_fds=(wfd,), text=True,
            start_new_session=True)
        os.close(wfd)
        self.results = os.fdopen(rfd, "r")
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.results, selectors.EVENT_READ)
        self.buf = ""
        msg = self._read(300)
        if not isinstance(msg, dict) or not msg.get("ready"):
            self.kill()
            raise RuntimeError("conformance worker failed to start (see the log)")

    def _read(self, timeout: float):
        deadline = time.monotonic() + timeout
        while "\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sel.select(left):
                return None  # timeout
            chunk = os.read(self.results.fileno(), 1 << 16).decode()
            if not chunk:
                return "eof"
            self.buf += chunk
        line, self.buf = self.buf.split("\n", 1)
        return json.loads(line)

    def run(self, case, timeout: float):
        self.proc.stdin.write(json.dumps(case) + "\n")
        self.proc.stdin.flush()
        return self._read(timeout)

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.results.close()

    def close(self):
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except Exception:  # noqa: BLE001
            self.kill()


# ------------------------------------------------------------------ driver

def summarize(results):
    """{dtype: {kind: {passed, failed, skipped}}} over counted cases."""
    table = collections.defaultdict(lambda: collections.defaultdict(collections.Counter))
    for r in results:
        if r["status"] in ("passed", "failed", "skipped"):
            table[r["dtype"]][r["kind"]][r["status"]] += 1
    return table


def print_table(table, dtypes, kinds, file=sys.stdout):
    print(f"{'dtype':<10} {'kind':<10} {'passed':>7} {'failed':>7} {'skipped':>8}", file=file)
    for d in dtypes:
        tot = collections.Counter()
        for k in kinds:
            c = table[d][k]
            if not c:
                continue  # no such cases (gradients are float32 only)
            tot.update(c)
            print(f"{d:<10} {k:<10} {c['passed']:>7} {c['failed']:>7} {c['skipped']:>8}", file=file)
        print(f"{d:<10} {'all':<10} {tot['passed']:>7} {tot['failed']:>7} {tot['skipped']:>8}", file=file)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ci", action="store_true", help="only the CI shard's cases")
    ap.add_argument("--ops", help="comma-separated op names (name or name.variant)")
    ap.add_argument("--dtypes", help="comma-separated subset of float32,bfloat16,int64,bool")
    ap.add_argument("--kinds", help="comma-separated subset of forward,grad,noncontig,out")
    ap.add_argument("--max-samples", type=int, default=0, help="samples per case (0: all)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per case")
    ap.add_argument("--no-skips", action="store_true", help="run cases listed in the skip file too")
    ap.add_argument("--json", default=os.path.join(ROOT, "conformance.json"))
    ap.add_argument("--log", default=os.path.join(ROOT, "build", "conformance-worker.log"),
                    help="worker stdout/stderr")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every failure as it happens")
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker is not None:
        return worker(args.worker)

    # The parent only needs the case lists: it does not load torch_tpu (workers do).
    worker_env_autoload = os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD")
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    from helpers import opinfo_harness as H
    if worker_env_autoload is None:
        del os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"]
    else:
        os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = worker_env_autoload

    cases = H.ci_cases() if args.ci else H.full_cases()
    if args.ops:
        wanted = set(args.ops.split(","))
        cases = [c for c in cases if c[0] in wanted or c[0].split(".")[0] in wanted]
    if args.dtypes:
        cases = [c for c in cases if c[1] in args.dtypes.split(",")]
    if args.kinds:
        cases = [c for c in cases if c[2] in args.kinds.split(",")]
    if args.max_samples:
        cases = [(n, d, k, args.max_samples) for n, d, k, _ in cases]

    if args.no_skips:
        os.environ["CONFORMANCE_NO_SKIPS"] = "1"
    os.makedirs(os.path.dirname(args.log), exist_ok=True)
    log = open(args.log, "w")
    t0 = time.monotonic()
    results = []
    state = {"w": None}

    def start_worker():
        # A worker may fail to start while the extension is being rebuilt: wait (10 min at most).
        for attempt in range(20):
            try:
                return Worker(log)
            except RuntimeError:
                if attempt == 19:
                    raise
                time.sleep(30)

    def run_once(case):
        """(result dict, None) or (None, why the worker died)."""
        if state["w"] is None:
            state["w"] = start_worker()
        w = state["w"]
        r = w.run(list(case), args.timeout)
        if isinstance(r, dict):
            return r, None
        if r is None:
            how = f"timed out after {args.timeout:.0f} s"
        else:
            try:
                code = w.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                code = None
            how = f"worker crashed (exit {code}" + (f", {signal.Signals(-code).name})" if code and code < 0 else ")")
        w.kill()
        state["w"] = None
        return None, how

    for i, case in enumerate(cases):
        r, how = run_once(case)
        if r is None and "crashed" in how:
            # Once more in a fresh worker: a crash may come from an earlier case's damage (or
            # from the extension being replaced under a running process).
            r, how2 = run_once(case)
            if r is not None:
                r["flaky"] = f"{how} on the first try"
            else:
                how = f"{how}; again in a fresh worker: {how2}"
        if r is None:
            r = {"op": case[0], "dtype": case[1], "kind": case[2], "status": "failed",
                 "detail": how, "samples": 0, "seconds": args.timeout if "timed out" in how else 0.0}
        results.append(r)
        if r["status"] == "failed" and args.verbose:
            print(f"FAIL {r['op']} {r['dtype']} {r['kind']}: {r['detail'][:300]}", flush=True)
        if (i + 1) % 200 == 0:
            print(f"... {i + 1}/{len(cases)} cases, {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    w = state["w"]
    if w is not None:
        w.close()
    log.close()
    elapsed = time.monotonic() - t0

    dtypes = [d for d in H.DTYPES if any(c[1] == d for c in cases)]
    kinds = [k for k in H.KINDS if any(c[2] == k for c in cases)]
    table = summarize(results)
    print_table(table, dtypes, kinds)
    failed = [r for r in results if r["status"] == "failed"]
    for r in failed[:60]:
        print(f"failed: {r['op']} {r['dtype']} {r['kind']}: {r['detail'].splitlines()[0][:160]}")
    if len(failed) > 60:
        print(f"... and {len(failed) - 60} more failures (see {args.json})")
    for r in results:
        if r.get("flaky"):
            print(f"flaky: {r['op']} {r['dtype']} {r['kind']}: {r['flaky']}")
    counted = sum(r["status"] in ("passed", "failed", "skipped") for r in results)
    print(f"{counted} cases counted ({len(results) - counted} do not exist: dtype unsupported, "
          f"no out=/autograd) in {elapsed:.0f} s; details in {args.json}")
    report = {
        "mode": "ci" if args.ci else "full",
        "seconds": round(elapsed, 1),
        "summary": {d: {k: dict(table[d][k]) for k in kinds} for d in dtypes},
        "failed": [r for r in results if r["status"] == "failed"],
        "flaky": [r for r in results if r.get("flaky")],
        "not_applicable": sum(r["status"] == "n/a" for r in results),
        # Cases that exist but compared nothing (every sample rejected by CPU too, no out=, ...).
        "not_compared": [{k: r[k] for k in ("op", "dtype", "kind", "detail")} for r in results
                         if r["status"] == "n/a" and r["samples"]],
        "skipped": [{k: r[k] for k in ("op", "dtype", "kind", "detail")} for r in results
                    if r["status"] == "skipped"],
        "slowest": sorted(({k: r[k] for k in ("op", "dtype", "kind", "seconds")} for r in results),
                          key=lambda r: -r["seconds"])[:20],
    }
    with open(args.json, "w") as f:
        json.dump(report, f, indent=1)
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
