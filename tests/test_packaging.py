"""The built wheel carries its data (recipes, delegate tables, device scripts) and works from
outside the checkout: recipes load, `check` and `optimize` run, a device bundle is made and runs.

Builds the wheel once (pip, ~5 s, from a copy of the sources) and unpacks it into a temp folder,
the only place tflfuse is then imported from; the dependencies come from the test's environment.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from irgraphs import conv, model_of, to_bytes, unary

from tflfuse.ir import Graph
from tflfuse.resources import FOLDERS

REPO = Path(__file__).resolve().parents[1]


# what a clean checkout holds that the build reads (copied, so that the build leaves no build/
# or *.egg-info in the checkout and a stale build/ there cannot leak into the wheel)
_SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "tflfuse", *FOLDERS)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in _SOURCES:
        if (REPO / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(REPO / name, src / name, ignore=ignore)
        else:
            shutil.copy2(REPO / name, src / name)
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(src), "-w", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (path,) = out.glob("tflfuse-*.whl")
    return path


@pytest.fixture(scope="module")
def site(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(folder)
    return folder


def test_wheel_holds_every_data_file_unchanged(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for folder in FOLDERS:
            files = [p for p in sorted((REPO / folder).iterdir()) if p.is_file()]
            assert files, folder
            for p in files:
                member = f"tflfuse/data/{folder}/{p.name}"
                assert member in names, member
                assert z.read(member) == p.read_bytes(), member
    tops = {n.split("/")[0] for n in names}
    assert tops == {"tflfuse", "tflfuse-0.1.0.dist-info"}  # no top-level folders leak out


def _tiny_model(path: Path) -> Path:
    g = Graph("main")
    x = g.add_tensor("x", (1, 8, 8, 3))
    y = conv(g, x, 4, name="c").outputs[0]
    z = unary(g, "RELU", y).outputs[0]
    path.write_bytes(to_bytes(model_of(g, [x], [z])))
    return path


def _run(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )


def test_installed_wheel_works_outside_the_checkout(site: Path, tmp_path: Path) -> None:
    work = tmp_path / "elsewhere"
    work.mkdir()
    model = _tiny_model(work / "tiny.tflite")
    probe = (
        "import json, tflfuse, tflfuse.convert.recipe as r, tflfuse.targets as t,"
        " tflfuse.resources as s;"
        "print(json.dumps([tflfuse.__file__, r.available(), str(s.data_dir('delegates')),"
        " t.capability('edgetpu')['meta']['name'], r.load('edgetpu').input_type]))"
    )
    proc = _run(site, work, "-c", probe)
    assert proc.returncode == 0, proc.stderr
    where, recipes, delegates, table, io = json.loads(proc.stdout)
    assert Path(where).is_relative_to(site)
    assert Path(delegates).is_relative_to(site)
    assert recipes == ["cpu-float", "edgetpu", "gpu-fp16", "xnnpack-int8"]
    assert (table, io) == ("edgetpu", "uint8")

    for target in ("edgetpu", "xnnpack"):
        proc = _run(site, work, "-m", "tflfuse.cli", "check", model.name, "--target", target)
        assert proc.returncode == 0, proc.stderr
    proc = _run(site, work, "-m", "tflfuse.cli", "optimize", model.name, "-o", "opt.tflite")
    assert proc.returncode == 0, proc.stderr
    assert "2 -> 1 ops" in proc.stdout  # RELU fused into the conv

    make = "from tflfuse.deploy.packing import make_bundle; make_bundle(['opt.tflite'], 'bundle')"
    proc = _run(site, work, "-c", make)
    assert proc.returncode == 0, proc.stderr
    bench = ["bundle/bench_on_device.py", "--bundle", "bundle", "--runs", "3", "--warmup", "1"]
    proc = _run(site, work, *bench, "--json", "bundle/results/r.json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads((work / "bundle" / "results" / "r.json").read_text())
    assert [m["name"] for m in result["models"]] == ["opt.tflite"]


def test_the_quantizer_is_named_by_its_package() -> None:
    """The quantizer is litert-quantizer (formerly ai-edge-quantizer, the same API): everything a
    user reads (messages and routes in the package, its data, the README) names it so; the README
    mentions the old name once, so that users who know it find it."""
    readable = [
        *(REPO / "tflfuse").rglob("*.py"),
        *(p for folder in FOLDERS for p in (REPO / folder).rglob("*") if p.is_file()),
    ]
    old = [
        str(p.relative_to(REPO))
        for p in readable
        if "ai-edge-quantizer" in p.read_text(errors="ignore")
    ]
    assert old == []
    readme = (REPO / "README.md").read_text()
    assert readme.count("ai-edge-quantizer") == 1 and "formerly\nai-edge-quantizer" in readme
