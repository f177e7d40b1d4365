"""Export a Keras 3 model to ONNX and prove it matches (the README's command).

Usage: python export/to_onnx.py [MODEL.keras] [-o OUT.onnx] [options]

The same command as `keras-layers-export` and `python -m keras_layers.export`;
run from a checkout, the demo's files go to `artifacts/demo/` in it
(`$KERAS_LAYERS_HOME/demo` when set), as `keras-layers-export`'s do there.
"""

if __name__ == "__main__":
    import sys
    from pathlib import Path

    # Python puts this script's folder first on sys.path; nothing here is meant
    # to be imported from it, and a stray module there must not shadow a
    # dependency.
    del sys.path[0]
    try:
        from keras_layers.export.cli import default_demo_dir, run
    except ImportError as error:
        sys.exit(f'error: {error}. From the checkout: pip install -e ".[export]"')

    demo_dir = default_demo_dir(checkout=Path(__file__).resolve().parent.parent)
    sys.exit(run(prog="python export/to_onnx.py", demo_dir=demo_dir))
