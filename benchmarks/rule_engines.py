"""Our rule helper against onnxscript's rewriter, on the same rule and graph.

    python benchmarks/rule_engines.py            # about 1 minute
    python benchmarks/rule_engines.py --quick

The RMS norm fusion is written twice: ours (`keras_layers.export.passes.fusions.rms_norm`,
a `pattern.Rule`) and with onnxscript's `RewriteRule` (a pattern function, a
check that fails with a reason, a replacement). Both run on the graph our
pipeline hands the RMS norm fusion for keras-hub's Llama (4 layers x 256 wide,
as in benchmarks/attention_forms.py; --quick: 2 x 64), timed side by side,
each from the ONNX proto it gets to the proto it gives back: onnxscript's
rewriter works on its own IR, so its time includes the conversion there and
back. Both must fuse the same norms. Writes results/rule_engines[.quick].json;
docs/performance.md's table `rule_engines.speed` is rendered from it.
"""

import argparse
import copy
import sys
from pathlib import Path
from unittest import mock

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from benchmarks import attention_forms  # noqa: E402
from benchmarks.docs_tables import rule_engines_speed_table  # noqa: E402
from benchmarks.results_io import run_header, save_json  # noqa: E402
from benchmarks.timing import time_side_by_side  # noqa: E402


def graph_before_rms_norms(sizes: dict):
    """The proto and shapes `rms_norm.run` gets when our pipeline exports Llama."""
    import tempfile

    from keras_layers.export import ExportOptions, export_model
    from keras_layers.export.passes.fusions import rms_norm

    model = attention_forms.build("LlamaBackbone", sizes)
    seen = {}
    original = rms_norm.run

    def keep(proto, context):
        seen["proto"], seen["shapes"] = copy.deepcopy(proto), context.shapes
        return original(proto, context)

    with (
        tempfile.TemporaryDirectory() as folder,
        mock.patch.object(rms_norm, "run", keep),
    ):
        export_model(model, Path(folder) / "llama.onnx", ExportOptions(shapes=[(1, 8)]))
    return seen["proto"], seen["shapes"]


def onnxscript_rule():
    """The RMS norm rule in onnxscript's rewriter, with our checks for its form:
    x ** 2 (ours also takes x * x and folds a gain `Mul` after the norm)."""
    from onnxscript import ir
    from onnxscript.rewriter import pattern

    def form(op, x, power, axes, epsilon):
        mean = op.ReduceMean(op.Pow(x, power), axes, _allow_other_attributes=True)
        return op.Mul(x, op.Reciprocal(op.Sqrt(op.Add(mean, epsilon))))

    def scalar(value):
        found = value.const_value
        return None if found is None or found.size != 1 else float(found.numpy().reshape(-1)[0])

    def check(context, x, power, axes, epsilon, **_):
        result = pattern.MatchResult()
        if scalar(power) != 2.0:
            return result.fail("the mean is not of x ** 2", power)
        if x.shape is None or x.dtype != ir.DataType.FLOAT or not isinstance(x.shape[-1], int):
            return result.fail("x is not float32 with a known last axis", x)
        last = axes.const_value
        if last is None or last.numpy().reshape(-1).tolist() not in ([-1], [len(x.shape) - 1]):
            return result.fail("the mean is not over the last axis alone", axes)
        if scalar(epsilon) is None:
            return result.fail("the added epsilon is not one constant", epsilon)
        return result

    def rewrite(op, x, power, axes, epsilon, **_):
        scale = op.initializer(ir.tensor(np.ones(x.shape[-1], np.float32)), name=f"{x.name}_rms")
        return op.SimplifiedLayerNormalization(x, scale, axis=-1, epsilon=scalar(epsilon))

    return pattern.RewriteRule(form, rewrite, check)


def measure(proto, shapes, rounds: int) -> dict:
    import onnx
    from onnxscript import ir

    from keras_layers.export.fusions import fuse_rms_norms

    rule = onnxscript_rule()
    counts = {}
    # onnxscript reads shapes from the proto's value_info: it gets them inferred.
    inferred = onnx.shape_inference.infer_shapes(proto, data_prop=True)

    def ours():
        copied = copy.deepcopy(proto)
        counts["ours"] = fuse_rms_norms(copied, shapes)

    def theirs():
        model = ir.serde.deserialize_model(copy.deepcopy(inferred))
        counts["onnxscript"] = rule.apply_to_model(model)
        ir.serde.serialize_model(model)

    def copying():  # what both pay to start from an untouched proto
        copy.deepcopy(proto)

    times = time_side_by_side(
        {"ours": ours, "onnxscript": theirs, "copy": copying}, rounds=rounds, calls=1
    )
    return {
        "nodes": len(proto.graph.node),
        "fused": counts,
        "ms": {name: times[name]["median_ms"] - times["copy"]["median_ms"] for name in counts},
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a 2-layer, 64-wide Llama")
    args = parser.parse_args(argv)
    sizes = attention_forms.QUICK_SIZES if args.quick else attention_forms.SIZES
    proto, shapes = graph_before_rms_norms(sizes)
    report = run_header("rule_engines.py", args.quick)
    report["rms_norm"] = measure(proto, shapes, rounds=5 if args.quick else 21)
    if len(set(report["rms_norm"]["fused"].values())) != 1:
        raise SystemExit(f"the two rules fused different counts: {report['rms_norm']['fused']}")
    print(f"keras-hub Llama, {report['rms_norm']['nodes']} nodes")
    print(rule_engines_speed_table(report))
    print(f"wrote {save_json(report, 'rule_engines', args.quick)}.json")
    return report


if __name__ == "__main__":
    main()
