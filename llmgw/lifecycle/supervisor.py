"""``serve --workers N``: N worker processes accept on the same address under this supervisor.

The supervisor holds the address (a bound socket that does not listen, so the port stays taken while
a worker restarts) and prepares the database (the embedded cluster, migrations) once, then starts
the workers: each is ``llmgw serve --worker-id N`` listening with SO_REUSEPORT, so the kernel
spreads connections over them. The supervisor forwards SIGTERM, SIGINT and SIGHUP, gives the
workers the grace to drain on a stop, replaces a worker that dies (waiting longer after each death
before it accepted connections), and gives up with the worker's exit status (or 1) when one keeps
dying at start.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time

import attrs

from llmgw.telemetry.setup import SHUTDOWN_SECONDS

__all__ = ["READY_FD_ARGUMENT", "WORKER_ID_ARGUMENT", "supervise", "tell_ready"]

log = logging.getLogger("llmgw.supervisor")

WORKER_ID_ARGUMENT = "--worker-id"
# A pipe the worker writes one byte to once it accepts connections: a worker that exits without
# having written it did not start.
READY_FD_ARGUMENT = "--ready-fd"

_MAX_START_FAILURES = 3
_FIRST_RESTART_DELAY = 0.5
_MAX_RESTART_DELAY = 30.0
# Past the grace: the workers' own resources and telemetry closing, then SIGKILL.
_STOP_MARGIN_SECONDS = SHUTDOWN_SECONDS + 5.0


@attrs.define
class _Worker:
    number: int
    process: asyncio.subprocess.Process
    started_at: float
    ready_pipe: int  # the read end
    start_failures: int = 0

    def was_ready(self) -> bool:
        """After it exited: whether it had told it accepted connections."""
        os.set_blocking(self.ready_pipe, False)
        try:
            return os.read(self.ready_pipe, 1) == b"1"
        except BlockingIOError:
            return False
        finally:
            os.close(self.ready_pipe)


class _Supervisor:
    def __init__(self, count: int, env: dict[str, str], grace: float) -> None:
        self._count = count
        self._env = env
        self._grace = grace
        self._stopping = asyncio.Event()
        self._workers: dict[int, _Worker] = {}

    async def _start(self, number: int, start_failures: int) -> _Worker:
        ready_read, ready_write = os.pipe()
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "llmgw",
                "serve",
                WORKER_ID_ARGUMENT,
                str(number),
                READY_FD_ARGUMENT,
                str(ready_write),
                env=self._env,
                stdin=asyncio.subprocess.DEVNULL,
                pass_fds=(ready_write,),
            )
        except BaseException:
            os.close(ready_read)
            raise
        finally:
            os.close(ready_write)
        log.info("worker %d started (pid %d)", number, process.pid)
        worker = _Worker(number, process, time.monotonic(), ready_read, start_failures)
        self._workers[number] = worker
        if self._stopping.is_set():  # the stop came while it was being started
            process.send_signal(signal.SIGTERM)
        return worker

    def _signal_all(self, signum: int) -> None:
        for worker in self._workers.values():
            if worker.process.returncode is None:
                worker.process.send_signal(signum)

    def _stop(self, signum: int) -> None:
        if not self._stopping.is_set():
            log.info("stopping %d workers (%s)", len(self._workers), signal.Signals(signum).name)
            self._stopping.set()
            self._signal_all(signal.SIGTERM)

    async def _keep(self, number: int) -> int:
        """Run worker ``number`` until the stop; 0, or the exit status when it keeps failing."""
        worker = await self._start(number, 0)
        while True:
            status = await worker.process.wait()
            lived = time.monotonic() - worker.started_at
            failures = 0 if worker.was_ready() else worker.start_failures + 1
            if self._stopping.is_set():
                return 0
            if failures >= _MAX_START_FAILURES:
                log.error(
                    "worker %d exited with status %d at start %d times in a row; giving up",
                    number,
                    status,
                    failures,
                )
                return status if status > 0 else 1
            delay = min(_FIRST_RESTART_DELAY * 2**failures, _MAX_RESTART_DELAY)
            log.warning(
                "worker %d (pid %d) exited with status %d after %.1fs; restarting it in %.1fs",
                number,
                worker.process.pid,
                status,
                lived,
                delay,
            )
            try:
                await asyncio.wait_for(self._stopping.wait(), delay)
                return 0
            except TimeoutError:
                worker = await self._start(number, failures)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._stop, signum)
        loop.add_signal_handler(signal.SIGHUP, self._signal_all, signal.SIGHUP)
        keepers = [asyncio.create_task(self._keep(n)) for n in range(1, self._count + 1)]
        stopping = asyncio.create_task(self._stopping.wait())
        done, _ = await asyncio.wait([*keepers, stopping], return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        failed = [task.result() for task in done if task in keepers and task.result() != 0]
        if failed:
            self._stopping.set()
            self._signal_all(signal.SIGTERM)
        await self._drain()
        await asyncio.gather(*keepers)
        return failed[0] if failed else 0

    async def _drain(self) -> None:
        running = [w.process for w in self._workers.values() if w.process.returncode is None]
        if not running:
            return
        _, late = await asyncio.wait(
            [asyncio.create_task(p.wait()) for p in running],
            timeout=self._grace + _STOP_MARGIN_SECONDS,
        )
        if late:
            log.error("%d workers did not stop in time; killing them", len(late))
            for process in running:
                if process.returncode is None:
                    process.kill()
            await asyncio.gather(*(p.wait() for p in running))


def tell_ready(ready_fd: int) -> None:
    """In a worker: tell the supervisor it accepts connections now."""
    os.write(ready_fd, b"1")
    os.close(ready_fd)


def supervise(count: int, env: dict[str, str], grace: float) -> int:
    """Run ``count`` workers until SIGTERM/SIGINT; the exit status of ``serve``."""
    return asyncio.run(_Supervisor(count, env, grace).run())
