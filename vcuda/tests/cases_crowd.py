"""More processes than the shared state has slots (256): a process that cannot get a slot gets no device memory
(its bytes could not be given back at its death, and the totals are rebuilt from the slots), it gets a slot as
soon as one is free, and the container's memory limit holds through exits in every order: normal exit, _exit,
SIGKILL, the slotless process first. Processes of both builds share the container."""

from __future__ import annotations

import signal
import subprocess

from cases_procaddr import dropin_env
from harness import UUID_A, Container, Fixture, GiB, Node, first_line
from registry import case

SLOTS = 256
LIMIT = 4 * GiB


class Proc:
    """A `vcmem serve` process: cuInit done, allocates or ends on command."""

    def __init__(self, c: Container, env: dict[str, str], quiet: bool = True) -> None:
        self.p = subprocess.Popen(
            [str(c.fx.build / "vcmem"), "serve"], env=env, cwd=c.root, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL if quiet else subprocess.PIPE, text=True,
        )

    def ready(self) -> None:
        assert first_line(self.p, "READY").startswith("READY")

    def alloc(self, n: int) -> int:
        assert self.p.stdin is not None
        self.p.stdin.write(f"alloc {n}\n")
        self.p.stdin.flush()
        return int(first_line(self.p, "ALLOC").split()[1])

    def end(self, how: str) -> None:
        """exit | _exit | kill: end the process that way and reap it."""
        if how == "kill":
            self.p.send_signal(signal.SIGKILL)
        else:
            assert self.p.stdin is not None
            self.p.stdin.write(how + "\n")
            self.p.stdin.flush()
        self.p.wait(timeout=30)

    def stderr(self) -> str:
        return self.p.stderr.read() if self.p.stderr else ""


def _filled(c: Container, env: dict[str, str]) -> int:
    return int(c.run("vcmem", "fill", env=env, timeout=60).ok().line("FILLED").split()[1])


@case("memory: 257+ processes: one without a slot gets no memory, and the limit holds through exits in any order",
      alone=True)
def crowd(fx: Fixture) -> None:
    node: Node = fx.node([(UUID_A, 16 * GiB, 80)])
    c = fx.container()
    c.write_limits([(UUID_A, LIMIT)])
    envs = [c.env(node), dropin_env(fx, c, node, explicit=True)]
    names = ["preload", "drop-in"]
    holders: list[Proc] = []
    others: list[Proc] = []
    try:
        for i in range(SLOTS):  # every slot taken by a process that initialised CUDA and holds nothing
            holders.append(Proc(c, envs[i % 2]))
        for h in holders:
            h.ready()
        # A 257th process (each build in turn) has no slot: refused, with one clear line.
        for b in (0, 1):
            x = Proc(c, envs[b], quiet=False)
            others.append(x)
            x.ready()
            assert x.alloc(3 * GiB) == 2, f"{names[b]}: a process without a slot was given 3 GiB"
            x.end("exit" if b == 0 else "_exit")  # the slotless process ends first
            err = x.stderr()
            assert err.count("gets no device memory") == 1 and "CUDA_ERROR_OUT_OF_MEMORY" in err, err
        assert _filled(c, envs[0]) == 0, "a new process without a slot was given memory"
        # A holder ends normally: its slot is free at once, and the next process takes it.
        holders.pop(0).end("exit")
        y = Proc(c, envs[1])
        others.append(y)
        y.ready()
        assert y.alloc(3 * GiB) == 0, "a process that found a free slot was refused"
        z = Proc(c, envs[0])  # slotless again
        others.append(z)
        z.ready()
        assert z.alloc(1 * GiB) == 2, "a process without a slot was given 1 GiB"
        # Holders die without a word (SIGKILL, _exit): z takes a slot once one is free, within the limit only.
        holders.pop(0).end("kill")
        holders.pop(0).end("_exit")
        assert z.alloc(2 * GiB) == 2, "3 + 2 GiB held against a 4 GiB limit"
        assert z.alloc(1 * GiB) == 0, "z found no slot after two holders died"
        assert _filled(c, envs[1]) == 0, "the container holds its whole limit, yet a new process got memory"
        # The holders of memory end in turn: killed, then normally.
        y.end("kill")
        assert _filled(c, envs[0]) == 3 * GiB, "a killed process's 3 GiB did not come back"
        z.end("exit")
        assert _filled(c, envs[1]) == LIMIT, "after every holder of memory ended, the limit was not whole"
        for i, h in enumerate(holders):  # the rest end in mixed ways
            h.end(("exit", "_exit", "kill")[i % 3])
        holders.clear()
        assert _filled(c, envs[0]) == LIMIT
    finally:
        for proc in holders + others:
            if proc.p.poll() is None:
                proc.p.kill()
            proc.p.wait(timeout=30)
        # Give the processes' pipes back before the next case.
        for proc in holders + others:
            for f in (proc.p.stdin, proc.p.stdout, proc.p.stderr):
                if f is not None:
                    f.close()
