"""Estimates beside published step times (torch_tpu.estimate.published.PUBLISHED).

    python bench/estimate_published.py [--fuse] [--overlap MODE] [name-substring ...]

Prints, per row: estimated and published step time, their ratio, HBM peak and fit. ``--fuse``
adds ``--fuse`` to every row (elementwise chains priced as defer_and_fuse's fused regions);
``--overlap schedule`` (or ``none``) adds it to every row (the layer-by-layer overlap schedule;
the exposed ICI / DCN / host seconds are printed beside the ratio).
"""

import json
import os
import subprocess
import sys
import time

from torch_tpu.estimate.published import PUBLISHED


def estimate_row(row, timeout=1200):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_TPU_", "TPU_"))}
    p = subprocess.run([sys.executable, "-m", "torch_tpu.estimate", *row["args"]], env=env, capture_output=True,
                       text=True, timeout=timeout)
    if p.returncode:
        raise RuntimeError(p.stderr[-3000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv):
    extra = [a for a in argv if a == "--fuse"]
    argv = [a for a in argv if a != "--fuse"]
    if "--overlap" in argv:
        i = argv.index("--overlap")
        extra += argv[i:i + 2]
        del argv[i:i + 2]
    for row in PUBLISHED:
        if argv and not any(a in row["name"] for a in argv):
            continue
        t0 = time.perf_counter()
        r = estimate_row(dict(row, args=row["args"] + extra))
        e = r["by_generation"][row["generation"]]
        print(f"{row['name']:<38} {row['role']:<8} est {e['step_time_s']:8.2f} s  published {row['step_s']:8.2f} s  "
              f"ratio {e['step_time_s'] / row['step_s']:.3f}  HBM {r['hbm_peak_bytes'] / 2**30:6.1f} GiB "
              f"fits {e['fits']}  exposed ICI {e['breakdown_s']['ici']:.2f} DCN {e['breakdown_s']['dcn']:.2f} "
              f"host {e['breakdown_s']['host']:.2f} s  ({time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
