"""Hand-built FX graphs for tests of torch.compile's graph compiler."""

import operator

import torch


def uncacheable_graph():
    """``x * 2`` then ``[0:2]`` on a tpu input of 3 elements: a slice argument has no plain-data
    form, so its program cannot be described by plain data (not cached, not serializable).

    Returns:
        (gm, x): the ATen-level GraphModule (node ``val`` metadata set) and a CPU input.
    """
    g = torch.fx.Graph()
    x = g.placeholder("x")
    y = g.call_function(torch.ops.aten.mul.Tensor, (x, 2.0))
    g.output((g.call_function(operator.getitem, (y, slice(0, 2))),))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    xt = torch.randn(3)
    for n in gm.graph.nodes:
        n.meta["val"] = xt.to("tpu")
    return gm, xt
