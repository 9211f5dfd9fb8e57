"""TorchRec (with fbgemm-gpu-cpu, whose CPU kernels the tpu fallback runs) on tpu against CPU:
EmbeddingBagCollection forward and backward over a KeyedJaggedTensor, and KeyedTensor.regroup.

The KeyedJaggedTensor is built on each device from the same CPU tensors: KeyedJaggedTensor.to()
copies a cached per-feature split (`_jt_dict`) without moving it, so a KJT used on CPU and then
moved still hands CPU tensors to the tpu model (TorchRec's behaviour for every device).
"""

import copy

import pytest
import torch
import torchrec
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor, KeyedTensor

VALUES = torch.tensor([1, 2, 3, 4, 5, 0, 1, 2, 9, 3])
LENGTHS = torch.tensor([2, 1, 0, 1, 3, 3])  # keys f1 (3 samples), then f2 (3 samples)
WEIGHTS = torch.linspace(0.5, 2.0, 10)


def make_kjt(device, weighted):
    return KeyedJaggedTensor.from_lengths_sync(
        keys=["f1", "f2"],
        values=VALUES.to(device),
        lengths=LENGTHS.to(device),
        weights=WEIGHTS.to(device) if weighted else None,
    )


def make_ebc(weighted):
    torch.manual_seed(0)
    tables = [
        EmbeddingBagConfig(
            name="t1", embedding_dim=4, num_embeddings=10, feature_names=["f1"], pooling=torchrec.PoolingType.SUM
        ),
        EmbeddingBagConfig(
            name="t2",
            embedding_dim=8,
            num_embeddings=12,
            feature_names=["f2"],
            pooling=torchrec.PoolingType.SUM if weighted else torchrec.PoolingType.MEAN,
        ),
    ]
    return EmbeddingBagCollection(tables=tables, is_weighted=weighted, device=torch.device("cpu"))


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_embedding_bag_collection_forward_backward_matches_cpu(weighted):
    ebc = make_ebc(weighted)
    tebc = copy.deepcopy(ebc).to("tpu")
    ref, out = ebc(make_kjt("cpu", weighted)), tebc(make_kjt("tpu", weighted))
    assert out.keys() == ref.keys() == ["f1", "f2"]
    assert out.values().device.type == "tpu" and out.values().shape == (3, 12)
    torch.testing.assert_close(out.values().cpu(), ref.values())
    for key in ("f1", "f2"):
        torch.testing.assert_close(out[key].cpu(), ref[key])
    scale = torch.arange(36.0).reshape(3, 12)  # a loss that weighs every output differently
    (ref.values() * scale).sum().backward()
    (out.values() * scale.to("tpu")).sum().backward()
    for (name, p), tp in zip(ebc.named_parameters(), tebc.parameters()):
        assert tp.grad.device.type == "tpu"
        torch.testing.assert_close(tp.grad.cpu(), p.grad, msg=name)


def test_keyed_tensor_regroup_matches_cpu():
    kts = [
        KeyedTensor(keys=["a", "b"], length_per_key=[2, 3], values=torch.randn(4, 5)),
        KeyedTensor(keys=["c"], length_per_key=[1], values=torch.randn(4, 1)),
    ]
    tkts = [KeyedTensor(keys=k.keys(), length_per_key=k.length_per_key(), values=k.values().to("tpu")) for k in kts]
    groups = [["c", "a"], ["b"]]
    for ref, out in zip(KeyedTensor.regroup(kts, groups), KeyedTensor.regroup(tkts, groups)):
        assert out.device.type == "tpu"
        torch.testing.assert_close(out.cpu(), ref)


@pytest.mark.parametrize("device", ["cpu", "tpu"])
def test_out_of_range_id_raises_as_on_cpu(device):
    tebc = make_ebc(False).to(device)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["f1", "f2"],
        values=torch.tensor([10, 0], device=device),
        lengths=torch.tensor([1, 0, 0, 1, 0, 0], device=device),
    )
    with pytest.raises(RuntimeError, match=r"takes value 10 which is not in the valid range \[0, 10\)"):
        tebc(kjt).values().cpu()
    assert tebc(make_kjt(device, False)).values().shape == (3, 12)  # the process keeps working
