"""Griffe extension for the docs build: show docstring examples as code.

Our docstrings follow Keras' layout: an `Example:` line, a blank line, then
doctest lines (`>>> ...`) at the docstring's own indentation, so that `doctest`
runs them. Griffe's Google parser only recognises an indented `Examples:`
section, so it passes these lines through as Markdown, where `>>>` starts a
nested block quote and `[0.841, ...]` in an expected output is read as a link.
This extension wraps every run of doctest lines in a fenced `pycon` block
instead, leaving the docstrings (and the doctests) as they are.
"""

import griffe

_PROMPTS = (">>>", "...")


def fence_doctests(text: str) -> str:
    """Wrap each doctest (prompts and the output up to a blank line) in a fence."""
    lines = text.split("\n")
    fenced = []
    index = 0
    while index < len(lines):
        line = lines[index]
        if not line.lstrip().startswith(">>>"):
            fenced.append(line)
            index += 1
            continue
        indent = line[: len(line) - len(line.lstrip())]
        fenced.append(f"{indent}```pycon")
        # A doctest ends at the first blank line, as doctest itself decides.
        while index < len(lines) and lines[index].strip():
            fenced.append(lines[index])
            index += 1
        fenced.append(f"{indent}```")
    return "\n".join(fenced)


class DoctestFences(griffe.Extension):
    """Fence doctest examples in every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        docstring = obj.docstring
        if docstring is not None and any(
            line.lstrip().startswith(_PROMPTS[0]) for line in docstring.value.splitlines()
        ):
            docstring.value = fence_doctests(docstring.value)
