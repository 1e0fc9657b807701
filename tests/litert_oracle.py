"""What the installed interpreter (ai-edge-litert) does with model bytes, asked in a worker process.

The loader tests hold tflfuse's loader to a contract with the interpreter (see
`tflfuse.ir.flatbuffer.from_bytes`). Mutated models can crash the interpreter in native code (a few
in a thousand segfault in `allocate_tensors`) or make it loop, so the questions go to a child
process: a crash or a hang is an answer about the model, not the end of the test session.

The child builds the interpreter with its default op resolver (XNNPACK on, as users run it),
allocates, invokes once with zero inputs, reads the outputs and then runs every signature the
same way. The answer is
the first stage that failed and what the interpreter said.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import struct
import subprocess
import sys
from dataclasses import dataclass

STAGES = ("construct", "allocate", "invoke", "signature")
# "io": the Python API could not put numpy zeros into an input or take an output out (a resource
# or variant tensor, a string tensor's bytes, a tensor whose size its producer changed): the
# interpreter gave no verdict on the model, so this is no answer.
IO_ERRORS = re.compile(r"Cannot set tensor|numpy array had \d+ bytes|Could not create PyBytes")


@dataclass(frozen=True)
class Verdict:
    """`stage` is "ok", the stage that failed (STAGES), "io", "crashed" or "hung"."""

    stage: str
    message: str = ""

    @property
    def runs(self) -> bool:
        return self.stage == "ok"

    @property
    def refuses(self) -> bool:
        """The interpreter would not run the model: it refused it, crashed or never returned."""
        return self.stage in (*STAGES, "crashed", "hung")


class Litert:
    """A worker process answering `run(model_bytes) -> Verdict`, restarted after a crash."""

    def __init__(self, timeout: float = 20.0) -> None:
        self.timeout = timeout
        self.proc: subprocess.Popen | None = None

    def _start(self) -> subprocess.Popen:
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
        return subprocess.Popen(
            [sys.executable, __file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )

    def run(self, data: bytes) -> Verdict:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        proc = self.proc
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(struct.pack("<Q", len(data)) + data)
            proc.stdin.flush()
        except BrokenPipeError:
            return self._lost("crashed")
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            if not sel.select(self.timeout):
                return self._lost("hung")
        line = proc.stdout.readline()
        if not line:
            return self._lost("crashed")
        answer = json.loads(line)
        return Verdict(answer["stage"], answer["message"])

    def _lost(self, stage: str) -> Verdict:
        code = None
        if self.proc is not None:
            self.proc.kill()
            code = self.proc.wait()
        self.proc = None
        return Verdict(stage, f"the interpreter process ended with {code}")

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def _ask(data: bytes) -> tuple[str, str]:
    """In the child: the first stage at which the interpreter refuses `data`. What the API says
    about the graph's and the signatures' tensors is asked before anything is fed, so that a
    structural refusal is not hidden behind an input numpy cannot fill."""
    import numpy as np
    from ai_edge_litert.interpreter import Interpreter

    stage = "construct"
    try:
        interpreter = Interpreter(model_content=data)
        stage = "allocate"
        interpreter.allocate_tensors()
        stage = "invoke"
        inputs, outputs = interpreter.get_input_details(), interpreter.get_output_details()
        stage = "signature"
        keys = list(interpreter.get_signature_list())
        for key in keys:  # a runner holds the interpreter: none may live across invoke()
            runner = interpreter.get_signature_runner(key)
            runner.get_input_details(), runner.get_output_details()
            del runner
        stage = "invoke"
        for d in inputs:
            interpreter.set_tensor(d["index"], np.zeros(d["shape"], d["dtype"]))
        interpreter.invoke()
        for d in outputs:
            interpreter.get_tensor(d["index"])
        stage = "signature"
        for key in keys:
            runner = interpreter.get_signature_runner(key)
            feeds = runner.get_input_details()
            runner(**{name: np.zeros(d["shape"], d["dtype"]) for name, d in feeds.items()})
            del runner
    except Exception as exc:
        message = " | ".join(str(exc).split("\n"))
        return ("io" if IO_ERRORS.search(message) else stage), message
    return "ok", ""


def _serve() -> None:
    # answers go to a private copy of stdout; whatever the interpreter prints goes to stderr
    stdout = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    stdin = sys.stdin.buffer
    while True:
        head = stdin.read(8)
        if len(head) < 8:
            return
        data = stdin.read(struct.unpack("<Q", head)[0])
        stage, message = _ask(data)
        stdout.write(json.dumps({"stage": stage, "message": message}) + "\n")
        stdout.flush()


if __name__ == "__main__":
    _serve()
