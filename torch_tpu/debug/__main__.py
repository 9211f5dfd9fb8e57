"""``python -m torch_tpu.debug``: print lists the code keeps, so that no document has to."""

import argparse

from . import fusible_ops


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m torch_tpu.debug", description=__doc__)
    p.add_argument("--fusible-ops", action="store_true",
                   help="the ATen operators defer_and_fuse records into fused regions, one a line")
    args = p.parse_args(argv)
    if not args.fusible_ops:
        p.error("nothing to print: give --fusible-ops")
    print("\n".join(fusible_ops()))


if __name__ == "__main__":
    main()
