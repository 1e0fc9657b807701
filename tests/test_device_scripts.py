"""Device side: the bundle and its manifest checks, the on-device bench without TensorFlow,
the early refusal of a model the device's interpreter cannot build (also on a real Python 3.7
with tflite-runtime alone, where one is installed), Python 3.7 syntax of everything shipped,
the Edge TPU compile step's fallbacks, and a real deploy round trip over SSH to an OpenSSH
server this test starts on 127.0.0.1."""

from __future__ import annotations

import ast
import getpass
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from irgraphs import conv, model_of, to_bytes

from tflfuse.deploy import packing
from tflfuse.deploy.deploy import SshTarget, deploy_and_bench
from tflfuse.device import bundle
from tflfuse.errors import TflfuseError
from tflfuse.ir import Graph

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "device_scripts"
NO_TF = (
    "import sys, runpy\n"
    "for name in ('tensorflow', 'keras', 'tf_keras'):\n"
    "    sys.modules[name] = None  # importing any of them now raises ImportError\n"
    "script = sys.argv[1]\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(script, run_name='__main__')\n"
)


def _model(n: int) -> bytes:
    g = Graph()
    x = g.add_tensor("x", (1, 8, 8, 4))
    y = x
    for i in range(n):
        y = conv(g, y, 4, act="RELU", name=f"c{i}").outputs[0]
    return to_bytes(model_of(g, [x], [y]))


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("models")
    paths = []
    for n in (3, 1):
        path = folder / f"chain{n}.tflite"
        path.write_bytes(_model(n))
        paths.append(path)
    return paths


@pytest.fixture
def made_bundle(models: list[Path], tmp_path: Path) -> Path:
    folder = tmp_path / "bundle"
    packing.make_bundle(models, folder, recipe="cpu-float")
    return folder


def _run_no_tf(script: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-c", NO_TF, str(script), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


# -- Python 3.7 (Coral's Mendel) -------------------------------------------------------------------
@pytest.mark.parametrize(
    "path",
    [SCRIPTS / bundle.ENTRY_POINT] + [REPO / "tflfuse" / m for m in bundle.SHIPPED_MODULES],
    ids=lambda p: p.relative_to(REPO).as_posix(),
)
def test_shipped_code_is_python37_syntax(path: Path) -> None:
    source = path.read_text()
    tree = ast.parse(source, feature_version=(3, 7))
    imports = {  # module level only: plotting imports matplotlib lazily, inside a function
        (node.module or "").split(".")[0] if isinstance(node, ast.ImportFrom) else a.name
        for node in tree.body
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for a in node.names
    }
    assert not imports & {"tensorflow", "keras", "tf_keras", "matplotlib"}
    if path.name != "__init__.py":  # annotations stay strings: `X | None` is fine on 3.8
        assert "from __future__ import annotations" in source
    # APIs newer than Python 3.8 or numpy 1.16 (Coral's Mendel image)
    newer = ("default_rng", "removeprefix", "removesuffix", "is_relative_to", "file_digest",
             "functools.cache", "strict=")  # fmt: skip
    assert [n for n in newer if n in source] == []


# -- bundle ------------------------------------------------------------------------------------
def test_bundle_manifest_lists_every_file_with_its_sha256(made_bundle: Path) -> None:
    manifest = bundle.verify_bundle(made_bundle)
    assert manifest["models"] == ["models/chain3.tflite", "models/chain1.tflite"]
    assert manifest["recipe"] == "cpu-float"
    assert {"tflfuse", "host_python", "host_interpreter"} <= set(manifest["versions"])
    shipped = {p.relative_to(made_bundle).as_posix() for p in made_bundle.rglob("*") if p.is_file()}
    assert set(manifest["files"]) == shipped - {bundle.MANIFEST}
    info = manifest["files"]["models/chain1.tflite"]
    assert info["sha256"] == bundle.sha256_file(made_bundle / "models/chain1.tflite")


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: (b / "models/chain1.tflite").write_bytes(b"\0" * 64), "corrupt"),
        (lambda b: (b / "tflfuse/device/bench.py").unlink(), "missing"),
        (lambda b: (b / "models/extra.tflite").write_bytes(b"x"), "does not list"),
        (lambda b: (b / bundle.MANIFEST).write_text("{"), "not valid JSON"),
        (lambda b: (b / bundle.MANIFEST).unlink(), "not a tflfuse bundle"),
    ],
    ids=["changed", "missing", "added", "bad-json", "no-manifest"],
)
def test_device_refuses_a_damaged_bundle(made_bundle: Path, damage, message) -> None:
    damage(made_bundle)
    with pytest.raises(bundle.BundleError, match=message):
        bundle.verify_bundle(made_bundle)
    proc = _run_no_tf(made_bundle / bundle.ENTRY_POINT, "--bundle", ".", cwd=made_bundle)
    assert proc.returncode == 2
    assert message in proc.stderr and proc.stderr.strip().count("\n") == 0


def test_device_refuses_a_mismatched_bundle(made_bundle: Path) -> None:
    with pytest.raises(bundle.BundleError, match="bundle mismatch"):
        bundle.verify_bundle(made_bundle, expected_id="0" * 64)
    good = bundle.manifest_id(made_bundle)
    assert bundle.verify_bundle(made_bundle, expected_id=good)["format"] == bundle.FORMAT


def test_make_bundle_refuses_bad_input(models: list[Path], tmp_path: Path) -> None:
    with pytest.raises(TflfuseError, match="no such model"):
        packing.make_bundle([tmp_path / "absent.tflite"], tmp_path / "b1")
    with pytest.raises(TflfuseError, match="share a file name"):
        packing.make_bundle([models[0], models[0]], tmp_path / "b2")


# -- the on-device bench -------------------------------------------------------------------------
def test_bench_on_device_runs_from_the_bundle_without_tensorflow(made_bundle: Path) -> None:
    expected = bundle.manifest_id(made_bundle)
    args = ["--bundle", ".", "--expect", expected, "--runs", "4", "--warmup", "1"]
    proc = _run_no_tf(made_bundle / bundle.ENTRY_POINT, *args, "--json", "results/r.json",
                      cwd=made_bundle)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads((made_bundle / "results/r.json").read_text())
    assert result["runner"]["tensorflow_imported"] is False
    assert Path(result["runner"]["tflfuse_source"]) == (made_bundle / "tflfuse").resolve()
    assert result["bundle"]["manifest_sha256"] == expected
    assert [m["name"] for m in result["models"]] == ["chain3.tflite", "chain1.tflite"]
    assert [m["op_count"] for m in result["models"]] == [3, 1]
    assert all(len(m["samples_ms"]) == 4 for m in result["models"])
    assert bundle.verify_bundle(made_bundle)  # results/ does not make the bundle "corrupt"


def test_bench_on_device_takes_plain_model_paths(models: list[Path], tmp_path: Path) -> None:
    proc = _run_no_tf(SCRIPTS / bundle.ENTRY_POINT, *map(str, models), "--runs", "2",
                      cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["protocol"]["runs"] == 2


# -- Edge TPU compile step -----------------------------------------------------------------------
def test_compile_script_calls_edgetpu_compiler_directly(models: list[Path], tmp_path: Path) -> None:
    fake = tmp_path / "bin" / "edgetpu_compiler"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        'echo "$@" > "$3/args.txt"\n'
        'for m; do :; done; n=$(basename "$m" .tflite)\n'
        'cp "$m" "$3/${n}_edgetpu.tflite"\n'
        "echo 'Edge TPU Compiler version 16.0'\n"
    )
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}"}
    out = tmp_path / "out"
    cmd = [sys.executable, str(SCRIPTS / "compile_edgetpu.py"), "--direct", str(models[0])]
    proc = subprocess.run([*cmd, "-o", str(out)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (out / "chain3_edgetpu.tflite").read_bytes() == models[0].read_bytes()
    assert (out / "args.txt").read_text().split() == ["-s", "-o", str(out), str(models[0])]
    assert "Edge TPU Compiler" in (out / "chain3_compile.log").read_text()


def test_compile_script_without_a_compiler_is_one_line(models: list[Path], tmp_path: Path) -> None:
    if shutil.which("edgetpu_compiler"):
        pytest.skip("edgetpu_compiler is installed here")
    env = {**os.environ, "PATH": os.defpath}
    cmd = [sys.executable, str(SCRIPTS / "compile_edgetpu.py"), "--direct", str(models[0])]
    proc = subprocess.run([*cmd, "-o", str(tmp_path)], env=env, capture_output=True, text=True)
    assert proc.returncode == 2
    assert "edgetpu_compiler not found" in proc.stderr and proc.stderr.count("\n") == 1


def test_compile_script_that_fails_leaves_no_log(models: list[Path], tmp_path: Path) -> None:
    """compile_edgetpu.py wrote MODEL_compile.log (and made -o) before it knew the compile had
    failed; a missing second model was found only after the first was compiled."""
    fake = tmp_path / "bin" / "edgetpu_compiler"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'Internal compiler error. Aborting!' >&2\nexit 1\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}"}
    out = tmp_path / "out"
    cmd = [sys.executable, str(SCRIPTS / "compile_edgetpu.py"), "--direct", str(models[0])]
    proc = subprocess.run([*cmd, "-o", str(out)], env=env, capture_output=True, text=True)
    assert proc.returncode == 2
    assert (
        proc.stderr == f"compile_edgetpu: error: {models[0]}: Internal compiler error. Aborting!\n"
    )
    assert list(out.iterdir()) == []
    missing = tmp_path / "missing.tflite"
    proc = subprocess.run(
        [*cmd, str(missing), "-o", str(tmp_path / "other")], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 2 and f"{missing}: no such model file" in proc.stderr
    assert not (tmp_path / "other").exists()


def test_deploy_script_takes_o_as_its_output() -> None:
    """`deploy.py -o` was an SSH option where `-o` is the output everywhere else."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        import deploy
    finally:
        sys.path.remove(str(SCRIPTS))
    args = deploy.parse_args(["m.tflite", "--host", "h", "-o", "r.json", "--ssh-option", "A=1"])
    assert args.json == "r.json" and args.ssh_option == ["A=1"]
    with pytest.raises(SystemExit):
        deploy.parse_args(["m.tflite", "--host", "h", "-o", "ConnectTimeout=5"])


# -- deploy over SSH to 127.0.0.1 ------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory):
    """An OpenSSH server on 127.0.0.1:<free port> accepting one generated key for this user."""
    sshd_bin = shutil.which("sshd") or (
        "/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists() else None
    )
    if not sshd_bin or not shutil.which("ssh") or not shutil.which("ssh-keygen"):
        pytest.skip("OpenSSH server or client not installed")
    if os.geteuid() == 0 and not Path("/run/sshd").is_dir():
        try:  # privilege separation directory sshd needs when started as root
            Path("/run/sshd").mkdir(mode=0o755, parents=True)
        except OSError:
            pytest.skip("cannot create /run/sshd")
    d = tmp_path_factory.mktemp("sshd")
    for key in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)],
                       check=True)  # fmt: skip
    (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
    (d / "authorized_keys").chmod(0o600)
    port = _free_port()
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d / 'host_key'}\n"
        f"AuthorizedKeysFile {d / 'authorized_keys'}\nPidFile {d / 'sshd.pid'}\n"
        "StrictModes no\nUsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "PubkeyAuthentication yes\nPermitRootLogin prohibit-password\nLogLevel ERROR\n"
    )
    host_pub = (d / "host_key.pub").read_text().split()
    (d / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    proc = subprocess.Popen(
        [sshd_bin, "-D", "-e", "-f", str(d / "sshd_config")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    target = SshTarget(
        f"{getpass.getuser()}@127.0.0.1",
        port=port,
        identity=str(d / "client_key"),
        options=[
            f"UserKnownHostsFile={d / 'known_hosts'}",
            "StrictHostKeyChecking=yes",
            "ConnectTimeout=5",
        ],
        timeout=120,
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            if proc.poll() is not None:
                pytest.skip(f"sshd did not start: {proc.stderr.read().decode().strip()[:200]}")
            try:
                if target.run("echo ready").strip() == b"ready":
                    break
            except TflfuseError as exc:
                if time.monotonic() > deadline:
                    pytest.skip(f"cannot log in to the test sshd: {exc}")
                time.sleep(0.3)
        yield target, d
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_deploy_round_trip_over_ssh(sshd, models: list[Path]) -> None:
    target, d = sshd
    remote = str(d / "device" / "tflfuse-bench")
    result = deploy_and_bench(
        models, target, remote, recipe="cpu-float", remote_python=sys.executable, runs=3, warmup=1
    )
    assert result["deploy"]["manifest_sha256"] == result["bundle"]["manifest_sha256"]
    assert result["bundle"]["recipe"] == "cpu-float"
    assert [m["op_count"] for m in result["models"]] == [3, 1]
    assert Path(result["runner"]["tflfuse_source"]) == (Path(remote) / "tflfuse").resolve()
    assert (Path(remote) / "results" / "bench.json").is_file()


def test_device_refuses_a_bundle_corrupted_after_the_push(sshd, models: list[Path]) -> None:
    from tflfuse.deploy.deploy import push_bundle, run_remote_bench

    target, d = sshd
    local = d / "local-bundle"
    shutil.rmtree(local, ignore_errors=True)
    packing.make_bundle(models, local)
    expected = bundle.manifest_id(local)
    remote = str(d / "device" / "corrupt")
    push_bundle(target, local, remote)
    target.run(f"printf x >> {remote}/models/chain1.tflite")
    with pytest.raises(TflfuseError, match=r"bundle is corrupt: models/chain1\.tflite"):
        run_remote_bench(target, remote, expected, remote_python=sys.executable, runs=2)
    push_bundle(target, local, remote)  # intact again, but not the bundle the host expects
    with pytest.raises(TflfuseError, match="bundle mismatch"):
        run_remote_bench(target, remote, "f" * 64, remote_python=sys.executable, runs=2)


def test_deploy_script_reports_an_unreachable_host_in_one_line(models: list[Path]) -> None:
    port = _free_port()  # nothing listens there
    cmd = [sys.executable, str(SCRIPTS / "deploy.py"), str(models[0]), "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--ssh-option", "ConnectTimeout=5"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("deploy: error: push on 127.0.0.1 failed")
    assert proc.stderr.strip().count("\n") == 0


# -- the device's interpreter ----------------------------------------------------------------------
def _versioned(op_type: str, version: int) -> bytes:
    """A conv net whose last op claims `version` (the operator code the interpreter resolves)."""
    g = Graph()
    x = g.add_tensor("x", (1, 8, 8, 4))
    op = conv(g, x, 4, act="RELU", name="c0")
    op.version = version
    return to_bytes(model_of(g, [x], [op.outputs[0]]))


def test_try_models_is_python37_syntax_without_tflfuse() -> None:
    source = (SCRIPTS / "try_models.py").read_text()
    tree = ast.parse(source, feature_version=(3, 7))
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not any(name and name.startswith("tflfuse") for name in imported)


def test_the_manifest_carries_each_models_verdict_per_runtime(made_bundle: Path) -> None:
    from tflfuse.targets import runtimes

    check = bundle.verify_bundle(made_bundle)["runtime_check"]
    assert check["format"] == bundle.RUNTIME_CHECK_FORMAT
    assert set(check["models"]) == {"models/chain3.tflite", "models/chain1.tflite"}
    verdicts = check["models"]["models/chain3.tflite"]["plain"]
    assert set(verdicts) == set(runtimes.known_runtimes())
    assert all(v is None for v in verdicts.values())  # CONV_2D v1 runs everywhere


def test_the_device_refuses_early_a_model_its_interpreter_cannot_build(tmp_path: Path) -> None:
    """CONV_2D v99 exists in no release: the bundle's verdict for this environment's interpreter
    (ai-edge-litert here) refuses it in one line before any model is loaded."""
    path = tmp_path / "future.tflite"
    path.write_bytes(_versioned("CONV_2D", 99))
    folder = tmp_path / "bundle"
    packing.make_bundle([path], folder)
    expected = bundle.manifest_id(folder)
    proc = _run_no_tf(folder / bundle.ENTRY_POINT, "--bundle", ".", "--expect", expected,
                      "--json", "results/r.json", cwd=folder)  # fmt: skip
    assert proc.returncode == 2
    line = proc.stderr.strip()
    assert line.count("\n") == 0
    assert line.startswith("bench_on_device: error: models/future.tflite: CONV_2D v99 (builtin 3)")
    assert "Didn't find op for builtin opcode 'CONV_2D' version '99'" in line
    assert not (folder / "results").exists()


def test_the_bench_json_records_the_interpreter_and_the_check(made_bundle: Path) -> None:
    args = ["--bundle", ".", "--runs", "2", "--warmup", "1", "--json", "results/r.json"]
    proc = _run_no_tf(made_bundle / bundle.ENTRY_POINT, *args, cwd=made_bundle)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((made_bundle / "results/r.json").read_text())
    interp = result["runner"]["interpreter"]
    assert interp["package"] in ("ai_edge_litert", "tflite_runtime")
    assert interp["runtime"] == f"{interp['package'].replace('_', '-')}=={interp['version']}"
    assert interp["libedgetpu"] is None  # not asked for without --delegate edgetpu
    assert result["runtime_check"]["checked"] is True
    assert set(result["runtime_check"]["as"].values()) == {interp["runtime"]}


def _mendel_like() -> Path | None:
    """Python 3.7 with only numpy and tflite-runtime 2.7.0 (benchmarks/install_runtimes.py)."""
    root = os.environ.get("TFLFUSE_RUNTIMES")
    python = Path(root or "/nonexistent") / "tflite-runtime-2.7.0" / "bin" / "python"
    return python if python.is_file() else None


@pytest.mark.skipif(_mendel_like() is None, reason="tflite-runtime 2.7.0 venv is not installed")
def test_a_real_python37_tflite_runtime_refuses_gelu_and_runs_its_lowered_twin(
    tmp_path: Path,
) -> None:
    from test_rules_runtime import gelu_model

    from tflfuse.convert.optimize import optimize_bytes

    gelu = tmp_path / "gelu.tflite"
    gelu.write_bytes(gelu_model(False))
    lowered = tmp_path / "gelu_27.tflite"
    lowered.write_bytes(optimize_bytes(gelu.read_bytes(), runtime="tflite-runtime==2.7.0").data)
    python = str(_mendel_like())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for models, code in (([gelu, lowered], 2), ([lowered], 0)):
        folder = tmp_path / f"bundle{code}"
        packing.make_bundle(models, folder)
        proc = subprocess.run(
            [python, bundle.ENTRY_POINT, "--bundle", ".", "--runs", "2", "--warmup", "1",
             "--json", "results/r.json"],
            cwd=folder, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == code, proc.stderr
        if code == 2:
            assert (
                "models/gelu.tflite: GELU v1 (builtin 150) cannot run on tflite-runtime 2.7.0"
                in (proc.stderr)
            )
        else:
            result = json.loads((folder / "results/r.json").read_text())
            assert result["environment"]["python"].startswith("3.7")
            assert result["runner"]["interpreter"]["version"] == "2.7.0"
            assert result["runner"]["tensorflow_imported"] is False
