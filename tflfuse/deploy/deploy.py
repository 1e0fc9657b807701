"""Deploy a benchmark bundle to a device over SSH, run it there, bring the result back.

Uses the system's OpenSSH client (`ssh`) as a subprocess, so keys, agents, jump hosts and
known_hosts work as the user already set them up; no Python SSH dependency. One connection
streams the bundle as a tar archive (`tar` exists on every Linux device image), one runs
`bench_on_device.py` against the manifest id computed here, one reads the result back. The
device refuses a bundle that does not match its manifest or the id the host expected.
"""

from __future__ import annotations

import io
import json
import shlex
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tflfuse.deploy.packing import make_bundle
from tflfuse.device.bundle import ENTRY_POINT, manifest_id
from tflfuse.errors import TflfuseError
from tflfuse.json_types import JSONDict


@dataclass
class SshTarget:
    """Where the device is and how to reach it (`host` may be `user@host`)."""

    host: str
    port: int | None = None
    identity: str | None = None
    options: list[str] = field(default_factory=list)  # extra `-o KEY=VALUE` settings
    ssh: str = "ssh"
    timeout: float = 600.0

    def command(self, remote: str) -> list[str]:
        cmd = [self.ssh, "-o", "BatchMode=yes"]
        if self.port:
            cmd += ["-p", str(self.port)]
        if self.identity:
            cmd += ["-i", self.identity, "-o", "IdentitiesOnly=yes"]
        for option in self.options:
            cmd += ["-o", option]
        return [*cmd, self.host, remote]

    def run(self, remote: str, stdin: bytes | None = None, what: str = "ssh") -> bytes:
        """Run `remote` (a shell command line) on the device; its stdout. TflfuseError with the
        remote's last stderr line when it fails."""
        try:
            proc = subprocess.run(
                self.command(remote),
                input=stdin,
                capture_output=True,
                timeout=self.timeout,
                check=False,
            )
        except FileNotFoundError:
            raise TflfuseError(f"{self.ssh}: not found (install the OpenSSH client)") from None
        except subprocess.TimeoutExpired:
            raise TflfuseError(
                f"{what} on {self.host} timed out after {self.timeout:.0f} s"
            ) from None
        if proc.returncode != 0:
            lines = proc.stderr.decode(errors="replace").strip().splitlines()
            detail = lines[-1] if lines else f"exit status {proc.returncode}"
            raise TflfuseError(f"{what} on {self.host} failed: {detail}")
        return proc.stdout


def tar_bytes(folder: Path) -> bytes:
    """The folder's contents as an uncompressed tar archive (paths relative to it)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted(Path(folder).rglob("*")):
            if "__pycache__" not in path.parts:
                tar.add(path, arcname=path.relative_to(folder).as_posix(), recursive=False)
    return buffer.getvalue()


def push_bundle(target: SshTarget, bundle_dir: Path, remote_dir: str) -> None:
    """Replace `remote_dir` on the device with the bundle's contents."""
    quoted = shlex.quote(remote_dir)
    target.run(
        f"rm -rf {quoted} && mkdir -p {quoted} && tar -x -f - -C {quoted}",
        stdin=tar_bytes(bundle_dir),
        what="push",
    )


def run_remote_bench(
    target: SshTarget,
    remote_dir: str,
    expected_id: str,
    *,
    remote_python: str = "python3",
    delegate: str = "xnnpack",
    runs: int = 100,
    warmup: int = 10,
    threads: int | None = None,
) -> JSONDict:
    """Run the bundle's bench on the device against `expected_id`; the result it wrote."""
    args = [remote_python, ENTRY_POINT, "--bundle", ".", "--expect", expected_id]
    args += ["--delegate", delegate, "--runs", str(runs), "--warmup", str(warmup)]
    if threads:
        args += ["--threads", str(threads)]
    args += ["--json", "results/bench.json"]
    quoted = " ".join(shlex.quote(a) for a in args)
    target.run(f"cd {shlex.quote(remote_dir)} && {quoted}", what="the device bench")
    raw = target.run(f"cat {shlex.quote(remote_dir)}/results/bench.json", what="pull")
    try:
        return json.loads(raw.decode())
    except ValueError:
        raise TflfuseError("the device returned a result that is not JSON") from None


def deploy_and_bench(
    models: list[Path],
    target: SshTarget,
    remote_dir: str,
    *,
    recipe: str | None = None,
    remote_python: str = "python3",
    delegate: str = "xnnpack",
    runs: int = 100,
    warmup: int = 10,
    threads: int | None = None,
) -> JSONDict:
    """Bundle `models`, push them, run the protocol on the device, return its result."""
    with tempfile.TemporaryDirectory(prefix="tflfuse-bundle-") as tmp:
        folder = Path(tmp) / "bundle"
        make_bundle([Path(m) for m in models], folder, recipe=recipe)
        expected = manifest_id(folder)
        push_bundle(target, folder, remote_dir)
    result = run_remote_bench(
        target,
        remote_dir,
        expected,
        remote_python=remote_python,
        delegate=delegate,
        runs=runs,
        warmup=warmup,
        threads=threads,
    )
    result["deploy"] = {"host": target.host, "remote_dir": remote_dir, "manifest_sha256": expected}
    return result
