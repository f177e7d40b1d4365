"""onnxslim: constant folding, dead nodes and initializers (tf2onnx keeps
copies of weights that only feed `Shape`). It serialises the proto, so it runs
only where `context.run_onnxslim` (protos up to 2 GB)."""

from keras_layers.export.passes.context import Context, PassResult


def run(proto, context: Context) -> PassResult:
    """Run onnxslim over the model.

    Args:
        proto: the ModelProto (onnxslim returns a new one).
        context: not read (the stage runs this pass only where
            `run_onnxslim` allows).

    Returns:
        The slimmed proto, and how many nodes fewer it has.
    """
    import onnxslim  # (imported here: the heaviest pass, and only for protos up to 2 GB)

    del context
    before = len(proto.graph.node)
    slimmed = onnxslim.slim(proto)
    return PassResult(slimmed, changed=before - len(slimmed.graph.node))
