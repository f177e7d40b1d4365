"""The parts every benchmark report shares: its header and where it is written."""

import json
import os
import platform
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
CONFIG_KEYS = ["vocabulary", "width", "layers", "intermediate", "heads"]


def run_header(script: str, quick: bool) -> dict:
    """Date, machine and the command that reproduces the run."""
    return {
        "date": time.strftime("%Y-%m-%d"),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "command": f"python benchmarks/{script}" + (" --quick" if quick else ""),
    }


def header(script: str, quick: bool, config: tuple) -> dict:
    """`run_header`, and the encoder the run measured."""
    return run_header(script, quick) | {"config": dict(zip(CONFIG_KEYS, config, strict=True))}


def save_json(report: dict, name: str, quick: bool) -> Path:
    """Write `results/NAME[.quick].json`; its path without the suffix."""
    stem = RESULTS / (f"{name}.quick" if quick else name)
    RESULTS.mkdir(exist_ok=True)
    Path(f"{stem}.json").write_text(json.dumps(report, indent=2))
    return stem


def save(report: dict, name: str, quick: bool, print_table, plot) -> dict:
    """Print the table, then write `results/NAME[.quick].json` and `.png`."""
    print_table(report)
    stem = save_json(report, name, quick)
    plot(report, Path(f"{stem}.png"))
    print(f"wrote {stem}.json and .png")
    return report


def finish_figure(fig, report: dict, path: Path) -> None:
    """Title the figure with the command, date and cores; write and close it."""
    import matplotlib.pyplot as plt

    fig.suptitle(f"{report['command']} ({report['date']}, {report['machine']['cores']} cores)")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
