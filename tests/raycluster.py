"""A throwaway Ray cluster on 127.0.0.1 for the sweep tests and benchmarks/sweep_bench.py.

`Cluster(nodes=2)` starts a head (`ray start --head --block`) and further nodes (`ray start
--address ... --block`), one CPU each, each with its own --temp-dir and its own free ports (other
people's clusters on this machine keep theirs), and stops them by killing the PIDs it started
(the `--block` process takes its node's processes with it): never `ray stop`, never a kill by
name. The nodes' workers import tflfuse from this checkout (PYTHONPATH). The cluster has its own
auth token (Ray 2.60 turns token auth on once ~/.ray/auth_token exists, which a local
`ray.init()` writes): `cluster.env` holds what a driver needs to connect (RAY_AUTH_MODE=token,
RAY_AUTH_TOKEN_PATH), set in the nodes' environment and to be set in the driver's.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PORT_OPTIONS = (
    "--node-manager-port",
    "--object-manager-port",
    "--dashboard-agent-listen-port",
    "--dashboard-agent-grpc-port",
    "--runtime-env-agent-port",
    "--metrics-export-port",
)


def ray_executable() -> str | None:
    """The `ray` command beside this Python (a venv's bin), or None."""
    exe = Path(sys.executable).with_name("ray")
    return str(exe) if exe.exists() else None


def free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


class Cluster:
    """`nodes` Ray nodes of `cpus` CPUs each on 127.0.0.1; `.address` for ray.init / --address."""

    def __init__(self, nodes: int = 2, cpus: int = 1) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="tfs-ray-", dir="/tmp"))  # short: socket paths
        self.procs: list[subprocess.Popen] = []
        self.cpus = cpus
        token = self.root / "auth_token"
        token.write_text(secrets.token_hex(32))
        self.env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
        gcs, client = free_ports(2)
        self.address = f"127.0.0.1:{gcs}"
        try:
            self._start(0, ["--head", f"--port={gcs}", f"--ray-client-server-port={client}"])
            self.wait_for(1)
            for i in range(1, nodes):
                self._start(i, [f"--address={self.address}"])
            self.wait_for(nodes)
        except BaseException:
            self.stop()
            raise

    def _start(self, i: int, role: list[str]) -> None:
        temp = self.root / f"n{i}"
        temp.mkdir()
        ports = [f"{opt}={p}" for opt, p in zip(PORT_OPTIONS, free_ports(len(PORT_OPTIONS)))]
        cmd = [ray_executable() or "ray", "start", *role, "--block", f"--temp-dir={temp}"]
        cmd += [f"--num-cpus={self.cpus}", "--disable-usage-stats"]
        cmd += ["--include-dashboard=false"] if i == 0 else []
        cmd += ["--object-store-memory=100000000", "--node-ip-address=127.0.0.1", *ports]
        path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path, **self.env}
        log = (self.root / f"n{i}.log").open("wb")
        self.procs.append(
            subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.root)
        )

    def wait_for(self, nodes: int, timeout: float = 90) -> None:
        """Until `nodes` nodes are alive (asked with a short-lived driver process)."""
        code = (
            "import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False,"
            " logging_level='ERROR'); print(sum(n['Alive'] for n in ray.nodes()))"
        )
        deadline, said = time.monotonic() + timeout, ""
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"a ray node ended: {self.log_tail()}")
            out = subprocess.run(
                [sys.executable, "-c", code, self.address],
                env={**os.environ, **self.env},
                capture_output=True,
                text=True,
                check=False,
            )
            if out.returncode == 0 and out.stdout.strip().splitlines()[-1:] == [str(nodes)]:
                return
            said = (out.stdout + out.stderr)[-600:]
            time.sleep(1)
        raise RuntimeError(f"{nodes} ray nodes not up after {timeout} s: {said} {self.log_tail()}")

    def log_tail(self) -> str:
        logs = sorted(self.root.glob("n*.log"))
        return " | ".join(p.read_text(errors="replace")[-400:] for p in logs)

    def stop(self) -> None:
        """Kill the started `ray start --block` processes (workers first, the head last)."""
        for proc in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
