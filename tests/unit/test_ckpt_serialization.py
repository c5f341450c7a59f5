"""Wire format of the checkpoint transports: skeleton + raw blobs, no sockets."""

from __future__ import annotations

import io
import json
import pickle
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch

from torchft_pg.checkpointing.serialization import SMALL_BLOB_BYTES, pack, prepare_receive, unpack
from torchft_pg.checkpointing.skeleton import FORMAT, decode_skeleton
from torchft_pg.errors import RecoveryError


def assert_same(a: Any, b: Any, path: str = "") -> None:
    """Deep equality with exact container types, dtypes and tensor values."""
    assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert torch.equal(a, b), path
    elif isinstance(a, dict):
        assert list(a) == list(b), path
        for k in a:
            assert_same(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


def roundtrip(sd: Any, step: int = 3) -> Any:
    packed = pack(sd, step)
    skeleton = decode_skeleton(packed.skeleton_bytes)
    assert skeleton.step == step
    _, _, blobs = prepare_receive(skeleton, None, torch.device("cpu"))
    for dst, src in zip(blobs, packed.blobs, strict=True):
        dst.copy_(src)  # what a transport does, byte for byte
    return unpack(skeleton, blobs)


def test_nested_pytree_with_optimizer_like_leaves_roundtrips() -> None:
    sd = {
        "model": OrderedDict(w=torch.randn(3, 4), b=torch.zeros(4)),
        "optim": {
            "state": {0: {"step": torch.tensor(5.0), "exp_avg": torch.ones(3, 4)}},
            "param_groups": [
                {"lr": 0.1, "betas": (0.9, 0.999), "params": [0, 1], "foreach": None, "name": "g"}
            ],
        },
        "misc": [1, 2.5, True, None, "s", b"raw", 1 + 2j, torch.float16, torch.device("cpu")],
        "edge": [float("inf"), -0.0, 2**80, "ünï", {True: 1, 1.5: 2, None: 3, b"k": 4}],
        "size": torch.Size([2, 3]),
        7: (torch.arange(3),),
    }
    assert_same(sd, roundtrip(sd))


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.bool,
        torch.int8,
        torch.uint8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.complex64,
    ],
)
def test_every_dtype_roundtrips_bit_exact(dtype: torch.dtype) -> None:
    t = (torch.randn(5, 7) * 100).to(dtype) if dtype != torch.bool else torch.rand(5, 7) > 0.5
    odd = t.flatten()[:3]  # 3 elements: byte length not a multiple of 8
    out = roundtrip({"t": t, "odd": odd.clone(), "scalar": t[0, 0].clone()})
    assert out["t"].dtype == dtype and torch.equal(out["t"], t)
    assert torch.equal(out["odd"], odd) and out["scalar"].dim() == 0


def test_views_and_noncontiguous_tensors_keep_values_and_ties() -> None:
    base = torch.randn(64, 32)
    sd = {
        "w": base,
        "tied": base,
        "t": base.t(),
        "rows": base[10:20],
        "expand": torch.arange(4.0).expand(3, 4),
        "col": torch.randn(100, 100)[:, 3],  # tiny strided view of a big storage
        "cl": torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
        "conj": torch.randn(3, dtype=torch.complex64).conj(),
    }
    out = roundtrip(sd)
    for k, v in sd.items():
        assert torch.equal(out[k], v), k
    assert out["tied"].data_ptr() == out["w"].data_ptr(), "tied weights must stay tied"
    assert out["t"].stride() == sd["t"].stride()
    assert out["expand"].stride() == (0, 1)
    assert out["cl"].is_contiguous(memory_format=torch.channels_last)
    packed = pack(sd, 1)
    assert packed.nbytes < 64 * 32 * 4 + 100 * 4 + 4 * 4 + 2 * 3 * 4 * 5 * 4 + 3 * 8 + 64 * 5, (
        "the big storage behind 'col' must not be sent"
    )


def test_empty_and_zero_dim_tensors() -> None:
    sd = {"e": torch.empty(0, 3), "e2": torch.zeros(0, dtype=torch.int64), "s": torch.tensor(3)}
    out = roundtrip(sd)
    assert out["e"].shape == (0, 3) and out["e2"].dtype == torch.int64
    assert out["s"].item() == 3


def test_unsupported_leaf_names_its_path() -> None:
    with pytest.raises(TypeError, match=r"\('a', 0\).*object"):
        pack({"a": [object()]}, 1)


def test_in_place_receive_reuses_destination_memory() -> None:
    src = {"w": torch.randn(600, 600), "v": torch.randn(4)[::2], "b": torch.ones(3)}
    dst = {"w": torch.zeros(600, 600), "v": torch.zeros(2), "b": torch.zeros(2)}  # b: other shape
    packed = pack(src, 2)
    skeleton = decode_skeleton(packed.skeleton_bytes)
    dests, direct, blobs = prepare_receive(skeleton, dst, torch.device("cpu"))
    for d, s in zip(blobs, packed.blobs, strict=True):
        d.copy_(s)
    out = unpack(skeleton, blobs, dests)
    assert out["w"] is dst["w"] and torch.equal(dst["w"], src["w"])
    assert out["v"] is dst["v"] and torch.equal(dst["v"], src["v"])
    assert out["b"] is not dst["b"] and torch.equal(out["b"], src["b"])
    assert len(direct) >= 1, "contiguous 'w' must be received straight into dst['w']"


class _Evil:
    """Unpickling this would run code that writes a marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (Path.write_text, (self.marker, "pwned"))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_malicious_pickle_is_refused_not_executed(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    raw = pickle.dumps({"format": FORMAT, "evil": _Evil(marker)})
    buf = io.BytesIO()
    torch.save({"format": FORMAT, "evil": _Evil(marker)}, buf)
    for payload in (raw, buf.getvalue()):
        with pytest.raises(RecoveryError, match="refused"):
            decode_skeleton(payload)
    assert not marker.exists(), "the payload's __reduce__ must never run"


def _forge(**override: Any) -> bytes:
    fields: dict[str, Any] = {
        "format": FORMAT,
        "step": 1,
        "serial": "x",
        "tree": ["D", [[["V", "w"], ["T", 0]], [["V", 3], ["E", "cuda:0"]]]],
        "tensors": [[0, 0, "float32", [4], [1]]],
        "blobs": [16],
    }
    fields.update(override)
    return json.dumps(fields).encode()


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ({"tensors": [[0, 0, "float32", [100], [1]]]}, "needs bytes up to 400"),
        ({"tensors": [[3, 0, "float32", [4], [1]]]}, "out of range"),
        ({"tensors": [[0, 2, "float32", [1], [1]]]}, "misaligned"),
        ({"tensors": [[0, 0, "float99", [4], [1]]]}, "malformed"),
        ({"tensors": [[0, 0, "float32", [-4], [1]]]}, "non-negative"),
        ({"tree": ["T", 5]}, "out of range"),
        ({"tree": ["L", [["T", 0], ["T", 0]]]}, "repeated"),
        ({"tree": ["Q", 0]}, "unknown or malformed leaf"),
        ({"tree": ["X", 0]}, r"DTensor node must hold \[index, \[global shape\]\], got 0"),
        ({"tree": ["X", [0, 8]]}, "DTensor node must hold"),
        ({"tree": ["X", [0, [-8]]]}, "global shape must be at most 64 non-negative ints"),
        ({"tree": ["X", [0, [1] * 65]]}, "global shape must be at most 64 non-negative ints"),
        ({"tree": ["X", [0, [8, 2]]]}, r"global shape \[8, 2\] and local shard shape \[4\]"),
        ({"tree": ["X", [1, [8]]]}, "out of range"),
        ({"tree": ["L", [["X", [0, [8]]], ["T", 0]]]}, "repeated"),
        ({"tree": ["B", "zz"]}, "not hex"),
        ({"format": "other"}, "format"),
        ({"step": "1"}, "step must be int"),
        ({"blobs": [1 << 40]}, "blob 0 has 1099511627776 bytes but its tensors use 16"),
    ],
)
def test_forged_metadata_is_refused(override: dict[str, Any], match: str) -> None:
    ok = decode_skeleton(_forge())
    assert ok.blob_sizes == [16] and ok.paths == [("w",)]
    assert ok.tree[3] == torch.device("cuda", 0)
    with pytest.raises(RecoveryError, match=match):
        decode_skeleton(_forge(**override))


def test_dtensor_node_decodes_to_its_global_shape() -> None:
    skeleton = decode_skeleton(_forge(tree=["D", [[["V", "w"], ["X", [0, [12]]]]]]))
    assert skeleton.paths == [("w",)] and dict(skeleton.dtensors) == {0: (12,)}
    assert dict(decode_skeleton(_forge()).dtensors) == {}, "a plain tensor is no DTensor"


def test_many_small_tensors_share_one_blob() -> None:
    sd: dict[str, Any] = {
        f"layer{i}": {"w": torch.randn(16, 16), "b": torch.randn(16)} for i in range(200)
    }
    sd["big"] = torch.randn(SMALL_BLOB_BYTES // 4 + 1)
    packed = pack(sd, 1)
    assert len(packed.blobs) == 2, "one combined blob for the small tensors + the big one"
    assert packed.blobs[0].data_ptr() == sd["big"].data_ptr(), (
        "big tensors are sent from their own memory"
    )
    assert_same(sd, roundtrip(sd))


def test_garbage_metadata_is_refused() -> None:
    with pytest.raises(RecoveryError, match="refused"):
        decode_skeleton(b"\x00garbage")
