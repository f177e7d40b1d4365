"""The slim stage's layout: a graph toolkit that imports nothing of ours, and
passes that all take `run(proto, context)` and return a `PassResult`."""

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from keras_layers.export import graph, passes, slimming
from keras_layers.export.graph import Dim, Evaluation, ops, static_value, symbolic_dims
from keras_layers.export.passes import Context, PassResult, fusions

ROOT = Path(__file__).resolve().parent.parent
GRAPH = ROOT / "keras_layers" / "export" / "graph"


def _imported(tree) -> set[str]:
    """The modules a file's import statements name (relative ones as `.name`)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.add("." * node.level + (node.module or ""))
    return found


def test_the_graph_toolkit_imports_only_itself_numpy_onnx_and_the_standard_library():
    allowed = {"numpy", "onnx", *__import__("sys").stdlib_module_names}
    for path in sorted(GRAPH.glob("*.py")):
        for name in _imported(ast.parse(path.read_text())):
            if name.startswith("keras_layers"):
                assert name.startswith("keras_layers.export.graph"), f"{path.name}: {name}"
            else:
                assert not name.startswith(".."), f"{path.name}: {name}"
                assert name.startswith(".") or name.split(".")[0] in allowed, f"{path.name}: {name}"


def _pass_modules() -> list:
    """Every module of `passes` (and `passes.fusions`) that defines `run`."""
    found = []
    for package in (passes, fusions):
        for info in pkgutil.iter_modules(package.__path__):
            module = importlib.import_module(f"{package.__name__}.{info.name}")
            if hasattr(module, "run"):
                found.append(module)
    return found


def test_every_pass_has_the_one_signature_and_is_in_the_ordered_list():
    listed = {step.pass_ for step in slimming.PASSES}
    modules = _pass_modules()
    assert len(modules) >= 14
    for module in modules:
        signature = inspect.signature(module.run)
        assert list(signature.parameters) == ["proto", "context"], module.__name__
        assert signature.parameters["context"].annotation is Context, module.__name__
        assert signature.return_annotation is PassResult, module.__name__
        assert module in listed, f"{module.__name__} is not in slimming.PASSES"
    # A rule's module names the op it makes, the report's key.
    for module in modules:
        if hasattr(module, "RULE"):
            assert module.RULE.makes in module.MAKES, module.__name__


def _tiny_model():
    """x (batch, 4) -> x * 2 + b, with a repeated weight and a dead node."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["unk__1", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    constants = [
        numpy_helper.from_array(np.full(4, 2, np.float32), "two"),
        numpy_helper.from_array(np.arange(4, dtype=np.float32), "b"),
    ]
    nodes = [
        helper.make_node("Mul", ["x", "two"], ["scaled"]),
        helper.make_node("Add", ["scaled", "b"], ["y"]),
        helper.make_node("Neg", ["x"], ["unread"]),
    ]
    proto = helper.make_model(
        helper.make_graph(nodes, "tiny", [x], [y], constants),
        opset_imports=[helper.make_opsetid("", 18)],
    )
    return proto


def test_each_pass_returns_what_it_did_and_the_runner_carries_what_it_learned():
    proto = _tiny_model()
    context = Context.of(proto, axis_names={"x": ["batch", 4]}, positive=frozenset({"batch"}))
    final, results = passes.run_passes(slimming.PASSES, proto, context)
    ran = [step.pass_ for step, _ in results]
    assert ran == [step.pass_ for step in slimming.PASSES if step.when(context)]
    assert all(isinstance(result, PassResult) for _, result in results)
    learned = {fact for _, result in results for fact in result.learned}
    assert learned == {"shapes"}  # (no Shape to share: no copies to merge)
    assert "unread" not in [name for node in final.graph.node for name in node.output]
    assert final.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    onnx.checker.check_model(final)


def test_a_pass_left_out_of_the_list_does_not_run():
    steps = slimming.without(passes.canonical)
    assert passes.canonical not in [step.pass_ for step in steps]
    assert len(steps) == len(slimming.PASSES) - 1


def test_one_evaluation_gives_dims_and_values():
    """The reshape's dims (symbolic) and the scale computed from them (float32)
    come from the same evaluation, each op read from the one table."""
    nodes = [
        helper.make_node("Reshape", ["x", "flat"], ["rows"]),
        helper.make_node("Shape", ["rows"], ["shape"]),
        helper.make_node("Gather", ["shape", "last"], ["size"]),
        helper.make_node("Cast", ["size"], ["size_f"], to=TensorProto.FLOAT),
        helper.make_node("Sqrt", ["size_f"], ["root"]),
        helper.make_node("Reciprocal", ["root"], ["scale"]),
    ]
    model = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", 2, 8])],
        [helper.make_tensor_value_info("scale", TensorProto.FLOAT, [])],
        [
            numpy_helper.from_array(np.array([-1, 16], np.int64), "flat"),
            numpy_helper.from_array(np.array(1, np.int64), "last"),
        ],
    )
    evaluation = Evaluation(model, {"batch", "sequence"})
    batch_times_sequence = Dim((1, ("batch", "sequence")))
    assert evaluation.shape["rows"] == (batch_times_sequence, Dim.of(16))
    assert symbolic_dims(model)["rows"] == evaluation.shape["rows"]
    scale = evaluation.static_value("scale")
    assert scale.dtype == np.float32 and scale.item() == np.float32(1 / np.sqrt(np.float32(16)))
    g = graph.Graph(model)
    assert static_value(g, "scale").tobytes() == scale.tobytes()
    assert static_value(g, "shape").tolist() == [None, 16]
    assert {"Reshape", "Shape", "Gather", "Cast", "Sqrt", "Reciprocal"} <= set(ops.OPS)


def test_onnxslims_cleanups_ask_for_the_hidden_weights_by_name(tmp_path, monkeypatch):
    """The weights in a data file are graph inputs while onnxslim runs, and
    its cleanups asked whether each input is used by scanning every used
    tensor with `Variable.__eq__`: quadratic in the layers. Asked by name
    (`onnxslim_pass._UsedTensors`), the slimmed model is the same, byte for
    byte, for a small fraction of the comparisons."""
    from onnxslim.third_party.onnx_graphsurgeon.ir.tensor import Variable

    from keras_layers.export import compat
    from keras_layers.export.graph import weights
    from keras_layers.export.passes import onnxslim_pass

    count = 300
    nodes, initializers = [], []
    with open(tmp_path / "w.data", "wb") as data:
        for index in range(count):
            tensor = numpy_helper.from_array(np.full(256, index, np.float32), f"w{index}")
            weights._append(tensor, [weights.raw_bytes(np.full(256, index, np.float32))], data)
            initializers.append(tensor)
            source = "x" if index == 0 else f"h{index - 1}"
            nodes.append(helper.make_node("Add", [source, f"w{index}"], [f"h{index}"]))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 256])
    y = helper.make_tensor_value_info(f"h{count - 1}", TensorProto.FLOAT, ["batch", 256])
    model = helper.make_model(helper.make_graph(nodes, "chain", [x], [y], initializers))

    equal = Variable.__eq__
    calls = {"n": 0}

    def counted(self, other):
        calls["n"] += 1
        return equal(self, other)

    monkeypatch.setattr(Variable, "__eq__", counted)
    slimmed = onnxslim_pass.run(onnx.ModelProto.FromString(model.SerializeToString()), None)
    by_name = calls["n"]
    calls["n"] = 0
    monkeypatch.setattr(compat, "original", lambda owner, name, default=None: default)
    scanned = onnxslim_pass.run(onnx.ModelProto.FromString(model.SerializeToString()), None)

    assert slimmed.proto.SerializeToString() == scanned.proto.SerializeToString()
    assert len(slimmed.proto.graph.initializer) == count
    assert calls["n"] > count * count, calls  # the scan the fix removes
    assert by_name < calls["n"] / 20, (by_name, calls["n"])
