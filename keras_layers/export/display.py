"""What the command line shows: live progress while it works, the report after.

On a terminal each stage gets a live line (spinner, elapsed time, and a bar
for stages that count steps: the demo's training, the validation grid); when
output goes to a file or a pipe, one plain line per finished stage; with
`quiet`, nothing. Every path and name from outside is escaped, so rich markup
in it (`[bold]`) is printed as the text it is.
"""

from types import TracebackType

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from keras_layers.export.pipeline import StageEvent


class StageDisplay:
    """Receives the pipeline's `StageEvent`s (and the demo's training steps)
    and shows them; use it as a context manager around the work."""

    def __init__(self, console: Console, quiet: bool = False):
        self.console = console
        self.quiet = quiet
        self.live = console.is_terminal and not quiet
        self._progress = (
            Progress(
                SpinnerColumn(finished_text="[green]✓[/]"),
                TextColumn("{task.description:<10}"),
                BarColumn(bar_width=24),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
            )
            if self.live
            else None
        )
        self._tasks: dict[str, TaskID] = {}

    def __enter__(self) -> "StageDisplay":
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._progress is not None:
            self._progress.stop()

    def print(self, text: str) -> None:
        """A line of markup (callers escape what they insert), unless quiet."""
        if not self.quiet:
            self.console.print(text)

    def __call__(self, event: StageEvent) -> None:
        if self.quiet:
            return
        if self._progress is None:
            if event.seconds is not None:
                self.console.print(f"  [green]✓[/] {event.stage:<9} {event.seconds:6.2f} s")
            return
        task = self._tasks.get(event.stage)
        if task is None:
            task = self._progress.add_task(event.stage, total=None)
            self._tasks[event.stage] = task
        if event.total is not None:
            self._progress.update(task, total=event.total, completed=event.done)
        if event.seconds is not None:
            total = self._progress.tasks[self._tasks[event.stage]].total or 1
            self._progress.update(task, total=total, completed=total)
            self._progress.stop_task(task)

    def training_step(self, done: int, total: int) -> None:
        """The demo's training: `done` of `total` optimizer steps.

        Args:
            done: steps done.
            total: steps in all.
        """
        self(StageEvent("train", done=done, total=total))


def _number(value: float) -> str:
    return "inf" if value == float("inf") else f"{value:.2e}"


def render_tokenizer(report: dict, console: Console) -> None:
    """A table of the tokenizer files' identity, reader by reader.

    Args:
        report: `{"tokenizer": TokenizerFiles.report()}`, as `--tokenizer-only`
            returns it or a failed tokenizer export carries it.
        console: where to print.
    """
    identity = report["tokenizer"].get("identity")
    if identity is None:
        return
    table = Table(title=f"{identity['family']} tokenizer files vs keras-hub", show_lines=False)
    table.add_column("reader", min_width=len("onnxruntime-extensions"), no_wrap=True)
    for column in ("compared", "differ", "known gaps", "unexplained", "result"):
        table.add_column(column, justify="right")
    for reader in identity["readers"]:
        differ, unexplained = len(reader["differences"]), len(reader["unexplained"])
        if reader["error"] is not None:
            verdict = f"not loaded: {escape(reader['error'])}"
            verdict = verdict if reader["passed"] else f"[red]FAIL[/] {verdict}"
        elif reader["measured_only"]:
            verdict = "measured (another algorithm)"
        else:
            verdict = "[green]pass[/]" if reader["passed"] else "[red]FAIL[/]"
        table.add_row(
            escape(reader["reader"]),
            str(reader["compared"]),
            str(differ),
            str(differ - unexplained),
            str(unexplained),
            verdict,
        )
    console.print(table)
    console.print(f"on {identity['texts']} texts of the stress corpus")


def render_report(report: dict, console: Console) -> None:
    """A table of the checks and a one-line summary of the file.

    Args:
        report: the export's report (`export_model`'s, or a failed export's),
            or `checking.validate`'s.
        console: where to print.
    """
    table = Table(title="ONNX Runtime vs Keras", show_lines=False)
    # The figures never wrap; the shape (a causal LM's labels are long) takes
    # the width left, and folds rather than cutting a word in the middle.
    table.add_column("shape", ratio=1, overflow="fold")
    table.add_column("output", max_width=16, overflow="ellipsis")
    for column in ("max abs", "max rel", "top-1", "result"):
        table.add_column(column, justify="right", no_wrap=column != "result")
    for check in report["checks"]:
        top1 = "" if check["top1_agreement"] is None else f"{check['top1_agreement']:.1%}"
        problem = escape(check["problem"] or "")
        verdict = "[green]pass[/]" if check["passed"] else f"[red]FAIL[/] {problem}"
        table.add_row(
            escape(check["shape"]),
            escape(check["output"]),
            _number(check["max_abs_diff"]),
            _number(check["max_rel_diff"]),
            top1,
            verdict,
        )
    console.print(table)
    for warning in report.get("warnings") or []:
        console.print(f"[yellow]warning:[/] {escape(warning)}")
    tolerance = report["tolerances"]
    if report.get("validated_only"):  # `checking.validate`: no export's figures
        console.print(f"atol {tolerance['atol']:g}, rtol {tolerance['rtol']:g}")
        for model_name, file_name in {
            **report["input_mapping"],
            **report["output_mapping"],
        }.items():
            console.print(f"the file's '{escape(file_name)}' taken as '{escape(model_name)}'")
        return
    console.print(
        f"file {report['file_bytes'] / 1e6:.2f} MB = {report['size_ratio']}x the "
        f"parameter bytes ({report['param_bytes'] / 1e6:.2f} MB); opset {report['opset']}; "
        f"{report['graph']['nodes_final']} nodes (tf2onnx: {report['graph']['nodes_converted']}); "
        f"atol {tolerance['atol']:g}, rtol {tolerance['rtol']:g}"
    )
    if report.get("constant_bytes"):
        console.print(
            f"plus {report['constant_bytes'] / 1e6:.2f} MB of constants that are no weight "
            "(a fixed position table, ...)"
        )
    unused = report.get("unused_weights") or []
    if unused:
        names = ", ".join(escape(entry["name"]) for entry in unused[:5])
        more = f" and {len(unused) - 5} more" if len(unused) > 5 else ""
        console.print(
            f"{len(unused)} weights the outputs never read are not in the file "
            f"({sum(entry['bytes'] for entry in unused) / 1e6:.2f} MB): {names}{more}"
        )


def render_streamed(report: dict, console: Console) -> None:
    """The streamed int4 export (`genai_folder`): what was quantized and its
    gate against Keras, on two lines.

    Args:
        report: the streamed export's report (`"streamed"` in it).
        console: where to print.
    """
    streamed = report["streamed"]
    console.print(
        f"streamed from the stored {', '.join(streamed['stored_policies']) or 'float32'} "
        f"weights ({streamed['weight_bytes'] / 1e9:.2f} GB): no float32 copy, no float "
        f"decoder written; fused {report['graph']['fused'] or 'nothing'}"
    )
    render_quantized_folder(report, console)


def render_quantized_folder(report: dict, console: Console) -> None:
    """Each quantized decoder of a folder (`--quantize int4|int8`, float or
    streamed export): its size and its gate against Keras, a line each.

    Args:
        report: a folder export's report (`folder.quantized`, where asked).
        console: where to print.
    """
    for kind, gate in (report.get("folder") or {}).get("quantized", {}).items():
        genai = gate.get("genai_agreement")
        console.print(
            f"{kind}: {gate['quantized']} products in MatMulNBits, {gate['file_bytes'] / 1e9:.2f} "
            f"GB; greedy agreement {gate['greedy_agreement']:.3f}"
            + ("" if genai is None else f" (genai {genai:.3f})")
            + f", mean |log p change| {gate['mean_abs_log_prob_change']:.4f} nats/token"
            + ("" if gate["passed"] else f": [red]FAIL[/] {escape(gate['failure'])}"),
            soft_wrap=True,
        )


def _gate_line(gate: dict) -> str:
    """One int8 gate's statistic, unescaped."""
    tokens = f" over {gate['tokens']} tokens" if gate["tokens"] else ""
    return f"{gate['output']}: {gate['statistic']} {gate['value']:.2%}{tokens}"


def render_int8_failure(int8: dict, console: Console) -> None:
    """Every reason a failed int8 file fails, one line each: its gates, its
    failed checks and the task-level check (the error line holds them too,
    but is cut at a length).

    Args:
        int8: the report's `int8` entry.
        console: where to print.
    """
    for gate in int8["gates"]:
        verdict = "[green]pass[/]" if gate["passed"] else f"[red]FAIL[/] {escape(gate['problem'])}"
        console.print(f"int8 gate, {escape(_gate_line(gate))}: {verdict}", soft_wrap=True)
    for check in int8["checks"]:
        if not check["passed"]:
            console.print(
                f"int8 check, {escape(check['output'])} at {escape(check['shape'])}: "
                f"[red]FAIL[/] {escape(check['problem'] or '')}",
                soft_wrap=True,
            )
    evaluation = int8["evaluation"]
    if evaluation is not None and not evaluation["passed"]:
        summary = evaluation.get("summary", "failed")
        console.print(f"int8 task-level check: [red]FAIL[/] {escape(summary)}", soft_wrap=True)


def int8_summary(int8: dict) -> str:
    """One line on the int8 file: size and how well it agrees with Keras."""
    gates = "; ".join(_gate_line(gate) for gate in int8["gates"])
    text = f"{int8['size_ratio']}x the float32 parameter bytes; " + (gates or "no gate")
    if int8.get("float_convolutions"):
        text += (
            f"; its {int8['float_convolutions']} convolutions keep float32 weights (int8 "
            "quantizes MatMul and Gather weights only)"
        )
    if int8["evaluation"] is not None:
        text += f"; {int8['evaluation'].get('summary', '')}"
    speed = int8.get("latency")
    if speed:
        text += (
            f"; {speed['int8_ms']} ms against float32's {speed['float32_ms']} ms "
            f"(x{speed['speedup']})"
        )
    return escape(text)
