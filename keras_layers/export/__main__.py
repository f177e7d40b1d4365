"""`python -m keras_layers.export`: the same command as `keras-layers-export`.

`-m` puts the working folder first on `sys.path`; it comes off before anything
is imported from there (`startup.drop_working_folder`). The package's
`__init__` files that ran before this module import nothing that Python had not
already loaded, so no module of the working folder ran before it either.
"""

if __name__ == "__main__":
    import sys

    from keras_layers.export import startup

    startup.drop_working_folder()
    from keras_layers.export.cli import run

    sys.exit(run(prog="python -m keras_layers.export"))
