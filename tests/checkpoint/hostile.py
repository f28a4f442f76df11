"""Building hostile checkpoints the way an attacker would: a real ``.tt`` file, edited,
with every checksum and the record binding recomputed, so that the attack reaches the code
under test instead of being stopped by a checksum."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.checkpoint.fixtures.make_fixtures import HERE
from tunetree.checkpoint import info, loading

SOURCE = HERE / "v1_openvino.tt"
"""A real checkpoint: three OpenVINO entries with artifacts."""


def parts(path: Path) -> tuple[dict[str, Any], dict[str, bytes], dict[str, int]]:
    """The record, every member's bytes and compression method of a ``.tt`` file."""
    data = path.read_bytes()
    _, length = struct.unpack("<II", data[:8])
    record = json.loads(data[8 : 8 + length])
    with zipfile.ZipFile(path) as z:
        members = {i.filename: z.read(i) for i in z.infolist()}
        methods = {i.filename: i.compress_type for i in z.infolist()}
    return record, members, methods


def rewrite(
    target: Path,
    *,
    manifest: Callable[[dict[str, Any]], Any] | None = None,
    record: Callable[[dict[str, Any]], Any] | None = None,
    members: dict[str, bytes] | None = None,
    methods: dict[str, int] | None = None,
    record_bytes: bytes | None = None,
    manifest_bytes: bytes | None = None,
    source: Path = SOURCE,
) -> Path:
    """Write ``target``: ``source`` with its record and manifest edited in place by the
    callables, members replaced or added, then checksums, sizes and the record's SHA-256
    recomputed. ``record_bytes``/``manifest_bytes`` replace the serialised text outright."""
    rec, files, kinds = parts(source)
    if record:
        record(rec)
    raw_record = record_bytes if record_bytes is not None else json.dumps(rec).encode()
    files.update(members or {})
    man = json.loads(files["manifest.json"])
    for name, body in files.items():
        if name != "manifest.json" and (name in (members or {}) or name in man["members"]):
            man["members"][name] = {"sha256": hashlib.sha256(body).hexdigest(), "size": len(body)}
    man["environment_sha256"] = hashlib.sha256(raw_record).hexdigest()
    if manifest:
        manifest(man)
    files["manifest.json"] = (
        manifest_bytes if manifest_bytes is not None else json.dumps(man).encode()
    )
    kinds.update(methods or {})
    with open(target, "wb") as f:
        f.write(struct.pack("<II", 1, len(raw_record)) + raw_record)
        with zipfile.ZipFile(f, "w") as z:
            for name, body in files.items():
                z.writestr(name, body, compress_type=kinds.get(name, zipfile.ZIP_DEFLATED))
    return target


def patch_zip_member(
    path: Path,
    name: str,
    *,
    flags: int | None = None,
    method: int | None = None,
    version: int | None = None,
) -> None:
    """Set the flag bits, method or "version needed to extract" (tenths: 232 is 23.2) of one
    member in both its local and central headers, as a hand-edited archive would (features
    the writer never produces)."""
    data = bytearray(path.read_bytes())
    encoded = name.encode()
    for signature, flag_at, name_at in ((b"PK\x03\x04", 6, 30), (b"PK\x01\x02", 8, 46)):
        start = 0
        while (at := data.find(signature, start)) >= 0:
            start = at + 4
            if data[at + name_at : at + name_at + len(encoded)] != encoded:
                continue
            if flags is not None:
                data[at + flag_at : at + flag_at + 2] = struct.pack("<H", flags)
            if method is not None:
                data[at + flag_at + 2 : at + flag_at + 4] = struct.pack("<H", method)
            if version is not None:
                data[at + flag_at - 2 : at + flag_at] = struct.pack("<H", version)
    path.write_bytes(bytes(data))


def as_recorded(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the running environment read as the file's own record (the attack is the file's
    content, not its environment)."""
    data = path.read_bytes()
    _, length = struct.unpack("<II", data[:8])
    try:
        recorded = json.loads(data[8 : 8 + length])
    except (ValueError, RecursionError):
        recorded = {}
    monkeypatch.setattr(loading, "environment_record", lambda kinds: recorded)
    monkeypatch.setattr(info, "environment_record", lambda kinds: recorded)


def copy_source(target: Path) -> Path:
    shutil.copyfile(SOURCE, target)
    return target


# --- the suite: every hostile file the tests build, by name ------------------------------------


def set_input_paths(*paths: list[Any]) -> Callable[[dict[str, Any]], None]:
    """An edit giving the first entry's runner these input paths (names, dtypes and shapes
    repeated to match, so only the paths are wrong)."""

    def edit(m: dict[str, Any]) -> None:
        record = m["entries"][0]["runner"]["inputs"]
        record["paths"] = [list(p) for p in paths]
        record["names"] = [f"arg{i}" for i in range(len(paths))]
        record["dtypes"] = [record["dtypes"][0]] * len(paths)
        record["shapes"] = [record["shapes"][0]] * len(paths)

    return edit


INPUT_PATHS = {
    "index out of range": [[["i", 0], ["i", 5]]],
    "attribute of the args tuple": [[["i", 0], ["a", "count"]]],
    "keyword of the args tuple": [[["k", "x"], ["i", 0]]],
    "attribute of a tensor": [[["i", 0], ["i", 0], ["a", "T"]]],
    "keyword that does not exist": [[["i", 1], ["k", "mask"]]],
    "duplicate": [[["i", 0], ["i", 0]], [["i", 0], ["i", 0]]],
}
"""Saved input paths that do not fit the fixture's graph ``(f32[2,8])`` (issue 19)."""


def _entry(edit: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], Any]:
    return lambda m: edit(m["entries"][0])


def _set_backend(kind: str, config: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    def edit(m: dict[str, Any]) -> None:
        for entry in m["entries"]:
            entry["backend"] = {"kind": kind, "config": config, "name": kind}

    return edit


def _records_backend(kind: str) -> Callable[[dict[str, Any]], None]:
    from tunetree.checkpoint.environment import backend_libraries, library_version

    def edit(r: dict[str, Any]) -> None:
        r["backends"] = sorted({*r["backends"], kind})
        for lib in backend_libraries(kind):
            r["versions"][lib] = library_version(lib)

    return edit


def _no_structure(m: dict[str, Any]) -> None:
    outputs = m["entries"][0]["runner"]["outputs"]
    outputs.pop("structure", None)
    outputs["spec"] = None


def _huge_learnt_graph(m: dict[str, Any]) -> None:
    m["entries"][0]["graph"]["args"][0]["shape"] = [16384, 16384]
    _no_structure(m)


ABSENT_MODULE_SPEC = (
    '[1, {"type": "tt_hostile_absent.X", "context": "null", '
    '"children_spec": [{"type": null, "context": null, "children_spec": []}]}]'
)
"""An output tree spec (first release's pytree JSON) naming a type of a module that does not
exist."""


def _wrong_checksum(member: str) -> Callable[[dict[str, Any]], None]:
    def edit(m: dict[str, Any]) -> None:
        m["members"][member]["sha256"] = "0" * 64

    return edit


def _zip(**patch: int) -> Callable[[Path], Path]:
    def build(target: Path) -> Path:
        path = rewrite(target)
        patch_zip_member(path, "runners/0/model.xml", **patch)
        return path

    return build


def _edited(**edits: Any) -> Callable[[Path], Path]:
    return lambda target: rewrite(target, **edits)


WEIGHTS = "weights.safetensors"
EAGER_SOURCE = HERE / "v1_eager.tt"
"""A real checkpoint: one eager entry for the whole model, no artifacts."""


def _weights(
    header: Callable[[dict[str, Any]], Any] | None = None,
    raw: Callable[[bytes], bytes] | None = None,
) -> Callable[[Path], Path]:
    """The source with its weights member edited: the safetensors header (as JSON, its length
    recomputed) or the raw bytes."""

    def build(target: Path) -> Path:
        data = parts(SOURCE)[1][WEIGHTS]
        if raw is not None:
            return rewrite(target, members={WEIGHTS: raw(data)})
        length = struct.unpack("<Q", data[:8])[0]
        table = json.loads(data[8 : 8 + length])
        assert header is not None
        header(table)
        text = json.dumps(table).encode()
        return rewrite(
            target, members={WEIGHTS: struct.pack("<Q", len(text)) + text + data[8 + length :]}
        )

    return build


def _first_tensor(table: dict[str, Any]) -> dict[str, Any]:
    return table[next(name for name in sorted(table) if name != "__metadata__")]


def _overlapping(table: dict[str, Any]) -> None:
    names = sorted(n for n in table if n != "__metadata__")
    table[names[1]]["data_offsets"] = table[names[0]]["data_offsets"]


def _as_pickle(data: bytes) -> bytes:
    import pickle

    return pickle.dumps({"0.weight": [[0.0] * 8] * 16}, protocol=2)


def _f16_openvino(target: Path) -> Path:
    """The first runner's OpenVINO model saved again with its weights compressed to f16 (a
    reduced-precision model under the results-keeping kind ``openvino``)."""
    import tempfile

    import openvino

    files = parts(SOURCE)[1]
    with tempfile.TemporaryDirectory() as scratch:
        xml, bin_ = Path(scratch) / "in.xml", Path(scratch) / "in.bin"
        xml.write_bytes(files["runners/0/model.xml"])
        bin_.write_bytes(files["runners/0/model.bin"])
        model = openvino.Core().read_model(str(xml), str(bin_))
        openvino.save_model(model, f"{scratch}/model.xml", compress_to_fp16=True)
        members = {
            "runners/0/model.xml": (Path(scratch) / "model.xml").read_bytes(),
            "runners/0/model.bin": (Path(scratch) / "model.bin").read_bytes(),
        }
    return rewrite(target, members=members)


def autocast_file(output_dtypes: Any, **config: Any) -> Callable[[Path], Path]:
    """The eager source with its entry made a bf16 Autocast runner recording
    ``output_dtypes`` (an Autocast runner has no artifact: only this record)."""

    def edit(m: dict[str, Any]) -> None:
        entry = m["entries"][0]
        entry["backend"] = {
            "kind": "autocast",
            "name": "autocast",
            "config": {"dtype": "bf16", "compile": False, "compile_mode": None,
                       "atol": 5e-2, "rtol": 5e-2, **config},
        }  # fmt: skip
        entry["runner"] = {"output_dtypes": output_dtypes}

    return lambda target: rewrite(
        target, manifest=edit, record=_records_backend("autocast"), source=EAGER_SOURCE
    )


SUITE: dict[str, Callable[[Path], Path]] = {
    "record lacks openvino": _edited(record=lambda r: r["versions"].pop("openvino")),
    "record lists eager only": _edited(record=lambda r: r.update(backends=["eager"])),
    "record with fractional cores": _edited(record=lambda r: r["cpu"].update(logical_cores=2.5)),
    "record without accelerators": _edited(record=lambda r: r.pop("accelerators")),
    "zip version 23.2": _zip(version=232),
    "zip strong encryption flag": _zip(flags=0x40),
    "zip method 99": _zip(method=99),
    "bzip2 member": _edited(methods={"runners/0/model.bin": zipfile.ZIP_BZIP2}),
    "member also a directory": _edited(members={"runners/0/model.xml/x": b"boo"}),
    "deep manifest": _edited(manifest_bytes=b'{"x": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"),
    "huge graph": _edited(
        manifest=_entry(lambda e: e["graph"]["args"][0].update(shape=[65536, 65536]))
    ),
    "huge learnt graph": _edited(manifest=_huge_learnt_graph),
    "huge output shapes": _edited(
        manifest=_entry(lambda e: e["runner"]["outputs"].update(shapes=[[1 << 30, 1 << 30]]))
    ),
    "large output shapes": _edited(
        manifest=_entry(lambda e: e["runner"]["outputs"].update(shapes=[[16384, 16384]]))
    ),
    "input dtype changed": _edited(
        manifest=_entry(lambda e: e["runner"]["inputs"].update(dtypes=["float64"]))
    ),
    "input rank changed": _edited(
        manifest=_entry(lambda e: e["runner"]["inputs"].update(shapes=[[2, 8, 1]]))
    ),
    "output positions out of range": _edited(
        manifest=_entry(lambda e: e["runner"]["outputs"].update(positions=[5]))
    ),
    "artifact outside the archive": _edited(
        manifest=_entry(lambda e: e["runner"].update(model="/etc/hostile.xml"))
    ),
    "private input attribute": _edited(
        manifest=_entry(
            lambda e: e["runner"]["inputs"].update(paths=[[["a", "__class__"], ["i", 0]]])
        )
    ),
    "bad device": _edited(manifest=lambda m: m.update(device="cuda:abc")),
    "other device type": _edited(manifest=lambda m: m.update(device="meta")),
    "unknown backend": _edited(manifest=_set_backend("nonesuch", {})),
    "untrusted inductor option": _edited(
        manifest=_set_backend(
            "inductor",
            {"mode": None, "dynamic": False, "fullgraph": False, "options": [["cpp.cxx", "sh"]]},
        ),
        record=_records_backend("inductor"),
    ),
    "openvino device naming a path": _edited(
        manifest=_set_backend("openvino", {"device": "HETERO:/etc/passwd"})
    ),
    **{
        f"input path: {name}": _edited(manifest=set_input_paths(*paths))
        for name, paths in INPUT_PATHS.items()
    },
    # Refused from the members' contents: the artifacts' element types and static shapes.
    "output dtype changed": _edited(
        manifest=_entry(lambda e: e["runner"]["outputs"].update(dtypes=["int64"]))
    ),
    "fixed size the artifact does not take": _edited(
        manifest=_entry(lambda e: e["graph"]["args"][0].update(shape=[3, 8]))
    ),
    "output structure naming a module": _edited(
        manifest=_entry(lambda e: e["runner"]["outputs"].update(spec=ABSENT_MODULE_SPEC))
    ),
    "artifact fails its checksum": _edited(manifest=_wrong_checksum("runners/0/model.bin")),
    "weights fail their checksum": _edited(manifest=_wrong_checksum("weights.safetensors")),
    # Issue 29: what info checked by SHA-256 only, or read from the record alone.
    "weights header length huge": _weights(raw=lambda d: struct.pack("<Q", 1 << 60) + d[8:]),
    "weights header past the end": _weights(raw=lambda d: struct.pack("<Q", len(d)) + d[8:]),
    "weights negative shape": _weights(lambda t: _first_tensor(t).update(shape=[-16, 8])),
    "weights lying shape": _weights(lambda t: _first_tensor(t).update(shape=[16, 9])),
    "weights overlapping": _weights(_overlapping),
    "weights unknown dtype": _weights(lambda t: _first_tensor(t).update(dtype="F128")),
    "weights as a pickle": _weights(raw=_as_pickle),
    "openvino model compressed to f16": _f16_openvino,
    "autocast dtypes unhashable": autocast_file([["f32"]]),
    "autocast dtypes unknown": autocast_file(["float128"]),
    "autocast dtypes not a list": autocast_file({"0": "f32"}),
}
"""Every hostile file of the suite: a name and how to build it from :data:`SOURCE`.

``tunetree info`` must refuse each as ``tt.load`` does, including those refused for what
the members hold (read by info too, without the model)."""


def openvino_weights(
    runner: int, transform: Callable[[Any, tuple[int, ...]], Any]
) -> Callable[[Path], Path]:
    """The source with runner ``runner``'s OpenVINO weights replaced by ``transform(array,
    shape)`` for every float32 constant, the model saved again (as an attacker with OpenVINO
    would), the manifest resealed."""

    def build(target: Path) -> Path:
        import tempfile

        import openvino

        files = parts(SOURCE)[1]
        with tempfile.TemporaryDirectory() as scratch:
            xml, bin_ = Path(scratch) / "in.xml", Path(scratch) / "in.bin"
            xml.write_bytes(files[f"runners/{runner}/model.xml"])
            bin_.write_bytes(files[f"runners/{runner}/model.bin"])
            model = openvino.Core().read_model(str(xml), str(bin_))
            for op in model.get_ops():
                if op.get_type_name() != "Constant":
                    continue
                if op.get_output_element_type(0).get_type_name() != "f32":
                    continue
                array = op.get_data().copy()
                new = openvino.op.Constant(transform(array, tuple(array.shape)))
                op.output(0).replace(new.output(0))
            openvino.save_model(model, f"{scratch}/model.xml", compress_to_fp16=False)
            members = {
                f"runners/{runner}/model.xml": (Path(scratch) / "model.xml").read_bytes(),
                f"runners/{runner}/model.bin": (Path(scratch) / "model.bin").read_bytes(),
            }
        return rewrite(target, members=members)

    return build


# --- issue 29: ONNX artifacts and generation keys ---------------------------------------------

ONNX_MODEL = "runners/0/model.onnx"


def _onnx_edited(edit: Callable[[Any], Any], **rewrite_args: Any) -> Callable[[Path], Path]:
    """A builder from an ONNX checkpoint: its model file parsed (external data left where it
    is), edited by ``edit(model)``, serialised again; the manifest resealed."""

    def build(target: Path, source: Path) -> Path:
        import onnx

        model = onnx.load_from_string(parts(source)[1][ONNX_MODEL])
        edit(model)
        return rewrite(
            target,
            members={ONNX_MODEL: model.SerializeToString()},
            source=source,
            **rewrite_args,
        )

    return build


def _external(name: str, location: str = "/etc/passwd") -> Any:
    """A float tensor of 4 elements whose bytes an ONNX model says live in ``location``."""
    from onnx import TensorProto

    tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=[4])
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "16")):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


def _sparse_external(name: str) -> Any:
    from onnx import TensorProto, helper

    indices = helper.make_tensor(f"{name}_indices", TensorProto.INT64, [4], [0, 1, 2, 3])
    return helper.make_sparse_tensor(_external(f"{name}_values"), indices, [4])


def _custom_domain(model: Any) -> None:
    model.graph.node[0].domain = "tt.hostile"
    model.opset_import.add(domain="tt.hostile", version=1)


def _sparse_initializer(model: Any) -> None:
    model.graph.sparse_initializer.append(_sparse_external("tt_sparse"))


def _sparse_constant(model: Any) -> None:
    from onnx import helper

    node = helper.make_node("Constant", [], ["tt_sparse_out"], name="tt_sparse")
    node.attribute.append(helper.make_attribute("sparse_value", _sparse_external("tt_sparse")))
    model.graph.node.insert(0, node)


def _subgraph_initializer(model: Any) -> None:
    """An ``If`` node whose branches hold an initializer naming an outside file."""
    from onnx import TensorProto, helper

    def branch(name: str) -> Any:
        out = helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [4])
        ident = helper.make_node("Identity", [f"{name}_w"], [f"{name}_out"])
        return helper.make_graph([ident], name, [], [out], [_external(f"{name}_w")])

    cond = helper.make_tensor("tt_cond", TensorProto.BOOL, [], [True])
    model.graph.initializer.append(cond)
    node = helper.make_node(
        "If", ["tt_cond"], ["tt_if_out"], then_branch=branch("then"), else_branch=branch("else")
    )
    model.graph.node.insert(0, node)


def _half_precision_detour(model: Any) -> None:
    """The graph's first input computed through float16 (Cast to f16 and back)."""
    from onnx import TensorProto, helper

    first = model.graph.input[0].name
    nodes = [
        helper.make_node("Cast", [first], ["tt_half"], to=TensorProto.FLOAT16),
        helper.make_node("Cast", ["tt_half"], ["tt_back"], to=TensorProto.FLOAT),
    ]
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            if name == first:
                node.input[i] = "tt_back"
    for node in reversed(nodes):
        model.graph.node.insert(0, node)


def _plain_onnxruntime(m: dict[str, Any]) -> None:
    m["entries"][0]["backend"] = {
        "kind": "onnxruntime",
        "name": "onnxruntime",
        "config": {"graph_optimization_level": "all", "intra_op_num_threads": None,
                   "inter_op_num_threads": None, "allow_spinning": False, "providers": None},
    }  # fmt: skip


ONNX_SUITE: dict[str, tuple[str, Callable[[Path, Path], Path]]] = {
    "onnx custom op domain": ("onnx", _onnx_edited(_custom_domain)),
    "onnx sparse initializer naming /etc/passwd": ("onnx", _onnx_edited(_sparse_initializer)),
    "onnx sparse Constant naming /etc/passwd": ("onnx", _onnx_edited(_sparse_constant)),
    "onnx subgraph initializer naming /etc/passwd": ("onnx", _onnx_edited(_subgraph_initializer)),
    "onnx float16 detour under kind onnxruntime": ("onnx", _onnx_edited(_half_precision_detour)),
    "onnx int8 model under kind onnxruntime": (
        "int8",
        lambda target, source: rewrite(
            target,
            manifest=_plain_onnxruntime,
            record=_records_backend("onnxruntime"),
            source=source,
        ),
    ),
}
"""Hostile ONNX checkpoints: a name, the source it is made from (``onnx``: the fixture's model
tuned with ONNX Runtime; ``int8``: with ONNX Runtime int8) and how."""


def _generation_layers(m: dict[str, Any], entry: int) -> list[Any]:
    cache = m["entries"][entry]["graph"]["args"][1]
    return dict(cache[2])["layers"][1]  # type: ignore[no-any-return]


def _rename_layers(name: str) -> Callable[[dict[str, Any]], None]:
    def edit(m: dict[str, Any]) -> None:
        for layer in _generation_layers(m, 1):
            layer[1] = name

    return edit


def _layer_attribute(attribute: list[Any]) -> Callable[[dict[str, Any]], None]:
    def edit(m: dict[str, Any]) -> None:
        _generation_layers(m, 1)[0][2].append(attribute)

    return edit


def _replicate(class_path: str) -> Callable[[dict[str, Any]], None]:
    def edit(m: dict[str, Any]) -> None:
        cache = m["entries"][1]["graph"]["args"][1]
        for pair in cache[2]:
            if pair[0] == "layer_class_to_replicate":
                pair[1] = ["const", "type", class_path]

    return edit


GENERATION_SUITE: dict[str, Callable[[dict[str, Any]], None]] = {
    "generation key naming QuantoQuantizedLayer": _rename_layers("QuantoQuantizedLayer"),
    "generation key naming a class of another module": _rename_layers("Popen"),
    "generation key attribute __class__": _layer_attribute(["__class__", ["const", "int", 1]]),
    "generation key type constant os.system": _replicate("os.system"),
}
"""Manifest edits of the tuned ``generate`` fixture's decode entry (``gpt2_generate.tt``)."""
