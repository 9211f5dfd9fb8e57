"""Helpers shared by the torch_tpu Python tests, imported as ``helpers.<module>`` from every folder.

tests/python is on sys.path whenever pytest runs these tests (the top conftest.py lives there, and
pytest puts its folder on the path), so ``from helpers.devices import needs_v6e_8`` works in
tests/python/<folder>/test_*.py alike; scripts/conformance.py puts it there itself. Fixtures stay in
conftest.py.

- devices.py        the default-topology marker and the chips some test files own
- paths.py          the repository root and its examples/ folder
- dist.py           launching tpu_dist scenarios, one process per rank
- dist_worker.py    one rank of a scenario (run as a script, by path)
- opinfo_harness.py OpInfo cases against CPU; opinfo_skips.py the skipped ones, with reasons
- import_graph.py   torch_tpu's static import graph and its cycles
- mxu.py            hand-rounded oracles of the float32 matmul precisions
"""
