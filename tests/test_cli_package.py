"""The command line as a package: the command X runs `run(args)` of tflfuse/cli/X.py, and a
command's module is loaded only when that command runs (so `--help` loads none of them, and
`inspect` none of the pipelines)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

from irgraphs import conv, model_of

from tflfuse.cli import build_parser
from tflfuse.ir import Graph, flatbuffer

CLI = Path(__file__).resolve().parents[1] / "tflfuse" / "cli"
SHARED = {"__init__", "__main__", "commands", "common"}  # the package's own modules


def _commands() -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return set(sub.choices)


def test_every_command_has_its_module_and_every_module_a_command() -> None:
    commands = _commands()
    assert {"inspect", "optimize", "check", "convert", "sweep"} <= commands
    for name in sorted(commands):
        module = importlib.import_module(f"tflfuse.cli.{name}")
        assert callable(getattr(module, "run", None)), name
    modules = {p.stem for p in CLI.glob("*.py")}
    assert modules - SHARED == commands


def _loaded(code: str) -> set[str]:
    """The tflfuse and TensorFlow modules a fresh interpreter has loaded after `code`."""
    probe = (
        f"{code}\nimport sys\n"
        "print(' '.join(m for m in sys.modules if m.startswith(('tflfuse', 'tensorflow'))),"
        " file=sys.stderr)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    return set(proc.stderr.strip().splitlines()[-1].split())


def test_help_loads_no_command_and_inspect_no_pipeline(tmp_path: Path) -> None:
    parsed = _loaded(
        "from tflfuse.cli import build_parser\n"
        "build_parser().parse_args(['convert', 'm', '-o', 'x'])"
    )
    assert {m for m in parsed if m.startswith("tflfuse.cli")} == {
        "tflfuse.cli",
        "tflfuse.cli.commands",
    }
    g = Graph("main")
    x = g.add_tensor("x", (1, 4, 4, 2))
    c = conv(g, x, 3)
    path = tmp_path / "m.tflite"
    flatbuffer.save(model_of(g, [x], [c.output]), path)
    inspected = _loaded(
        f"from tflfuse.cli import main\nassert main(['inspect', {str(path)!r}]) == 0"
    )
    assert "tflfuse.cli.inspect" in inspected
    assert not {
        m for m in inspected if m.startswith(("tflfuse.convert", "tflfuse.api", "tensorflow"))
    }
