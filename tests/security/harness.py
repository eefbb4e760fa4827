"""The red-team harness (issue 30): one attack against a real `stallhound serve` subprocess, measured.

Each run starts a fresh server (streamable HTTP with a bearer token, or stdio) in a sandbox of its own (HOME, working
folder, roots, cache and TMPDIR under one temp folder), connects real MCP clients (the SDK's), and runs the attack's
calls in one client while a second one (the bystander) calls describe_schema in a loop. It measures what issue 30
asks of every attack: the server still up afterwards (the process alive and a fresh call answered), the bystander's
p99 latency while the attack runs, the server's peak RSS (its children included, sampled, and the kernel's own
high-water mark), the files written outside the cache folder, the cache's growth, and whether the answer is one
sentence. A wall limit per attack kills a server that hangs ("hung"), and an RSS ceiling kills one that would
take the shared machine's memory ("over the ceiling"), both recorded as such."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import anyio
import httpx2
import psutil
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from stallhound.server.http import TOKEN_ENV

Transport = Literal["http", "stdio"]
TOKEN = "red-team-token-of-a-decent-length"
START_TIMEOUT_S = 60  # import and uvicorn start on a loaded 2-core machine
SAMPLE_S = 0.05  # RSS sampling period: short spikes between samples are caught by VmHWM for the main process
PROBE_TIMEOUT_S = 30  # the fresh call that says the server is still up
BYSTANDER_TIMEOUT_S = 120  # one describe_schema call; longer means the server starves other clients
DYING_S = 2  # a connection broken by a dying server: how long its process may take to end (an abort dumps first)
GRACE_S = 10  # how long the bystander's call in flight may finish after the attack ended
MAX_SENTENCE_CHARS = 400  # issue 30: echoed input is cut to 200 characters, the sentence around it is short
ADDRESS = re.compile(r"0x[0-9a-fA-F]{8,}")  # native addresses of a backtrace
BARE_ERROR = re.compile(r"Error executing tool \w+:?\s*")  # the SDK's wording when the tool gave no reason
# What the client and transport raise once the server is gone or killed mid-call.
GONE = (MCPError, OSError, EOFError, httpx2.HTTPError, anyio.BrokenResourceError, anyio.ClosedResourceError,
        anyio.EndOfStream)


@dataclass(frozen=True)
class Limits:
    """What an attack that fails safely stays within (the red-team tests assert these)."""
    wall_s: float = 120.0  # the whole attack: past it the server is killed and the row says "hung"
    rss_ceiling_mb: float = 4096.0  # past it the server is killed (the machine is shared): "over the ceiling"
    peak_rss_mb: float = 1500.0  # a safe attack stays under this
    other_p99_ms: float = 3000.0  # the bystander's p99 while the attack runs, on a loaded 2-core machine


@dataclass
class Sandbox:
    """The temp folders one server runs in: the attack's inputs go in `roots`, its models in `cache`."""
    base: Path

    @property
    def home(self) -> Path:
        return self.base / "home"

    @property
    def cwd(self) -> Path:
        return self.base / "cwd"

    @property
    def roots(self) -> Path:
        return self.base / "roots"

    @property
    def cache(self) -> Path:
        return self.base / "cache"

    @property
    def tmp(self) -> Path:
        return self.base / "tmp"

    def make(self) -> Sandbox:
        for folder in (self.home, self.cwd, self.roots, self.cache, self.tmp):
            folder.mkdir(parents=True, exist_ok=True)
        return self

    def watched(self) -> tuple[Path, ...]:
        """Every folder a server may not write into (all but the cache)."""
        return self.home, self.cwd, self.roots, self.tmp

    def env(self) -> dict[str, str]:
        keep = {k: v for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME", TOKEN_ENV)}
        return {**keep, "HOME": str(self.home), "TMPDIR": str(self.tmp), "XDG_CACHE_HOME": str(self.home / ".cache")}


@contextmanager
def sandbox() -> Iterator[Sandbox]:
    with tempfile.TemporaryDirectory(prefix="stallhound-redteam-") as base:
        yield Sandbox(Path(base)).make()


def snapshot(folders: tuple[Path, ...]) -> dict[str, tuple[int, int]]:
    """path -> (size, mtime_ns) of every file under `folders`."""
    files = {}
    for folder in folders:
        for path in folder.rglob("*"):
            if path.is_file() and not path.is_symlink():
                stat = path.stat()
                files[str(path)] = (stat.st_size, stat.st_mtime_ns)
    return files


def written(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> list[str]:
    return sorted(path for path, stamp in after.items() if before.get(path) != stamp)


def folder_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20


def sentence_problems(text: str) -> list[str]:
    """Why an error's text is not one sentence a user can act on (none: it is)."""
    problems = []
    if not text.strip():
        problems.append("empty")
    if "\n" in text.strip():
        problems.append(f"{text.strip().count(chr(10)) + 1} lines")
    if "Traceback" in text:
        problems.append("a traceback")
    if BARE_ERROR.fullmatch(text.strip()):
        problems.append("no reason")
    if len(text) > MAX_SENTENCE_CHARS:
        problems.append(f"{len(text):,} characters")
    if ADDRESS.search(text):
        problems.append("native addresses")
    if socket.gethostname() in text:
        problems.append("the host name")
    return problems


@dataclass
class Call:
    """One tool call; `arguments` may be a function of the sandbox, evaluated just before the call."""
    tool: str
    arguments: dict[str, Any] | Callable[[Sandbox], dict[str, Any]]

    def args(self, box: Sandbox) -> dict[str, Any]:
        return self.arguments(box) if callable(self.arguments) else self.arguments


@dataclass
class Answer:
    is_error: bool
    text: str


@dataclass
class Outcome:
    started: bool = True
    start_error: str = ""
    up: bool = False
    hung: bool = False
    died: bool = False
    exit_note: str = ""  # how the server process ended, where it did
    alive_at_end: bool = False  # the process, when the attack's calls ended
    over_ceiling: bool = False
    peak_rss_mb: float = 0.0
    time_s: float = 0.0  # the attack's calls, together
    latencies_s: list[float] = field(default_factory=list)  # the bystander's calls while the attack ran
    bystander_errors: list[str] = field(default_factory=list)
    answers: list[Answer] = field(default_factory=list)
    written_outside: list[str] = field(default_factory=list)
    cache_growth_mb: float = 0.0
    harm: str = ""  # what the attack's own check found (a leak, a file written, an answer that should be refused)

    @property
    def other_p99_ms(self) -> float | None:
        if not self.latencies_s:
            return None
        ordered = sorted(self.latencies_s)
        return 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]

    @property
    def answer(self) -> Answer | None:
        """The first error among the attack's calls (what a refusal said), else the last answer."""
        return next((a for a in self.answers if a.is_error), self.answers[-1] if self.answers else None)

    @property
    def sentence(self) -> str:
        if not self.started:
            return self.start_error
        if self.hung:
            return "hung"
        if self.over_ceiling:
            return "over the RSS ceiling"
        return self.answer.text if self.answer else ""

    @property
    def state(self) -> str:
        """The server after the attack: "yes" (up and answering), or how it went."""
        if self.hung:
            return "hung (killed at the wall limit)"
        if self.over_ceiling:
            return "killed at the RSS ceiling"
        return "yes" if self.up else f"went down{self.exit_note}"

    def problems(self, limits: Limits) -> list[str]:
        """Each way this attack did not fail safely (none: it did)."""
        if not self.started:
            return []
        found = [self.state] if self.state != "yes" else []
        if self.peak_rss_mb > limits.peak_rss_mb:
            found.append(f"peak RSS {self.peak_rss_mb:.0f} MB")
        p99 = self.other_p99_ms
        if p99 is None or p99 > limits.other_p99_ms:
            found.append("the other client got no answer" if p99 is None else f"other client's p99 {p99:.0f} ms")
        found += [f"bystander: {e}" for e in self.bystander_errors[:1]]
        if self.written_outside:
            found.append(f"wrote {len(self.written_outside)} files outside the cache")
        answer = self.answer
        if answer is not None and answer.is_error:
            found += [f"answer: {p}" for p in sentence_problems(answer.text)]
        return found + [self.harm] * bool(self.harm)


class RssWatch:
    """Peak RSS of a process and its children (summed: pages forked workers share count once per worker), sampled
    in a thread; calls `kill` past a ceiling."""

    def __init__(self, pid: int, ceiling_mb: float, kill: Callable[[], None]) -> None:
        self.proc, self.ceiling_mb, self.kill = psutil.Process(pid), ceiling_mb, kill
        self.peak_mb, self.over = 0.0, False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def sample(self) -> None:
        try:
            procs = [self.proc, *self.proc.children(recursive=True)]
            total = sum(p.memory_info().rss for p in procs if p.is_running()) / 2**20
            hwm = _vm_hwm_mb(self.proc.pid)
        except psutil.Error:
            return  # gone between the listing and the reading
        self.peak_mb = max(self.peak_mb, total, hwm)
        if total > self.ceiling_mb and not self.over:
            self.over = True
            self.kill()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.sample()


def _vm_hwm_mb(pid: int) -> float:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    return next((int(line.split()[1]) / 1024 for line in status.splitlines() if line.startswith("VmHWM:")), 0.0)


@dataclass
class Server:
    """A running `stallhound serve`: its process and how clients reach it."""
    transport: Transport
    pid: int
    box: Sandbox
    token: str | None
    url: str = ""
    params: StdioServerParameters | None = None
    popen: subprocess.Popen | None = None

    def alive(self) -> bool:
        try:
            return psutil.Process(self.pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def kill(self) -> None:
        """SIGKILL the server and every process it started (by their ids)."""
        try:
            procs = [psutil.Process(self.pid)]
            procs += procs[0].children(recursive=True)
        except psutil.NoSuchProcess:
            return
        for proc in procs:
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                continue

    def exit_note(self, wait_s: float = 0) -> str:
        """How the process ended (" (killed by SIGABRT)"), waiting up to `wait_s` for it; "" while it runs."""
        if self.popen is None:
            return ""
        try:
            code = self.popen.wait(wait_s) if wait_s else self.popen.poll()
        except subprocess.TimeoutExpired:
            return ""
        if code is None:
            return ""
        return f" (killed by {signal.Signals(-code).name})" if code < 0 else f" (exit status {code})"

    def client(self) -> Client:
        if self.transport == "stdio":
            assert self.params is not None
            return Client(self.params)
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {self.token}"})
        return Client(streamable_http_client(self.url, http_client=http))


def serve_args(box: Sandbox, extra: tuple[str, ...] = ()) -> list[str]:
    return ["-m", "stallhound", "serve", "--root", str(box.roots), "--cache-dir", str(box.cache), *extra]


class StartRefused(Exception):
    """The server did not start (its last line of stderr)."""


def start_http(box: Sandbox, token: str = TOKEN, extra: tuple[str, ...] = ()) -> Server:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (box.base / "server.log").open("w")
    cmd = [sys.executable, *serve_args(box, ("--transport", "http", "--port", str(port), *extra))]
    proc = subprocess.Popen(cmd, stdout=log, stderr=log, cwd=box.cwd, env={**box.env(), TOKEN_ENV: token},
                            start_new_session=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _accepts(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            lines = (box.base / "server.log").read_text().strip().splitlines()
            raise StartRefused(lines[-1] if lines else f"exited {proc.returncode} without a word")
        time.sleep(0.1)
    return Server("http", proc.pid, box, token, url=f"http://127.0.0.1:{port}/mcp", popen=proc)


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@asynccontextmanager
async def connected(client: Client) -> AsyncIterator[Client]:
    """`client` connected. When the server dies the client cancels what runs inside it and its hang-up fails: that
    failure is swallowed (the outcome records the death), so the caller's code after the block goes on."""
    entered = False
    try:
        async with client as ready:
            entered = True
            yield ready
    except* GONE:
        if not entered:
            raise


@asynccontextmanager
async def stdio_server(box: Sandbox) -> AsyncIterator[tuple[Server, Client]]:
    """A fresh server over stdio and its one client (the process lives as long as the client)."""
    params = StdioServerParameters(command=sys.executable, args=serve_args(box), env=box.env(), cwd=box.cwd)
    before = {p.pid for p in psutil.Process().children()}
    server = Server("stdio", 0, box, None, params=params)
    async with connected(server.client()) as client:
        spawned = [p.pid for p in psutil.Process().children() if p.pid not in before]
        assert len(spawned) == 1, spawned
        server.pid = spawned[0]
        try:
            yield server, client
        finally:
            server.kill()


def _answer(result: Any) -> Answer:
    return Answer(bool(result.is_error), "".join(getattr(c, "text", "") for c in result.content))


async def call(client: Client, box: Sandbox, step: Call, timeout_s: float) -> Answer:
    try:
        result = await client.call_tool(step.tool, step.args(box), read_timeout_seconds=timeout_s)
    except MCPError as exc:  # a protocol error (bad arguments the SDK refused, a timeout): its message is the answer
        return Answer(True, str(exc))
    return _answer(result)


async def bystander(client: Client, profile: str, done: anyio.Event, out: Outcome, since: list[float]) -> None:
    """describe_schema in a loop until the attack is done, each call's latency recorded (`since`: when the call in
    flight began)."""
    while True:
        t0 = since[0] = time.monotonic()
        try:
            result = await client.call_tool("describe_schema", {"profile": profile},
                                            read_timeout_seconds=BYSTANDER_TIMEOUT_S)
        except GONE as exc:
            out.bystander_errors.append(f"{type(exc).__name__}: {exc}"[:200])
            return
        out.latencies_s.append(time.monotonic() - t0)
        if result.is_error:
            out.bystander_errors.append(_answer(result).text[:200])
        if done.is_set():
            return


async def probe(server: Server, profile: str) -> bool:
    """A fresh call on a fresh connection (over stdio the process alive is all that can be asked) answers."""
    if not server.alive():
        return False
    if server.transport == "stdio":
        return True
    answered = False
    with anyio.move_on_after(PROBE_TIMEOUT_S):
        async with connected(server.client()) as fresh:
            answered = not (await fresh.call_tool("describe_schema", {"profile": profile})).is_error
    return answered


async def until_dead(server: Server, attack_scope: anyio.CancelScope, out: Outcome) -> None:
    """Ends the attack's calls as soon as the server process is gone (a call to a dead server may never return)."""
    while server.alive():
        await anyio.sleep(0.2)
    out.died = True
    attack_scope.cancel()


@dataclass
class Attack:
    """One attack: inputs built in the sandbox's roots (`prepare`, before the server starts), then `calls` in one
    client; `harm` looks for damage no generic measure sees (a leak, an answer that should have been refused)."""
    klass: int  # the class in issue 30's list
    name: str
    calls: list[Call]
    prepare: Callable[[Sandbox], None] | None = None
    harm: Callable[[Sandbox, Outcome], str] | None = None
    token: str = TOKEN  # the bearer token the server is started with (HTTP)


BYSTANDER = "bystander.sqlite"  # a copy of a small real export in every sandbox's roots


def run_attack(attack: Attack, bystander_source: Path, transport: Transport = "http",
               limits: Limits = Limits()) -> Outcome:
    """Run `attack` against a fresh server in a fresh sandbox and measure it (see the module's docstring)."""
    with sandbox() as box:
        (box.roots / BYSTANDER).write_bytes(bystander_source.read_bytes())
        if attack.prepare:
            attack.prepare(box)
        before = snapshot(box.watched())
        cache_before = folder_mb(box.cache)
        out = Outcome()
        try:
            anyio.run(_attack_served, attack, box, transport, limits, out)
        except StartRefused as exc:
            if attack.token == TOKEN:
                raise  # only an attack on the server's own checks may keep it from starting
            out.started, out.start_error = False, str(exc)
        out.written_outside = [p for p in written(before, snapshot(box.watched())) if p != str(box.base / "server.log")]
        out.cache_growth_mb = folder_mb(box.cache) - cache_before
        if attack.harm and out.started:
            out.harm = attack.harm(box, out)
        return out


async def _attack_served(attack: Attack, box: Sandbox, transport: Transport, limits: Limits, out: Outcome) -> None:
    if transport == "stdio":
        async with stdio_server(box) as (server, client):
            with RssWatch(server.pid, limits.rss_ceiling_mb, server.kill) as watch:
                await _strike(attack, box, server, client, client, limits, out)
        _measured(out, server, watch, out.alive_at_end)
        return
    server = start_http(box, attack.token)
    try:
        with RssWatch(server.pid, limits.rss_ceiling_mb, server.kill) as watch:
            async with connected(server.client()) as other, connected(server.client()) as attacker:
                await _strike(attack, box, server, attacker, other, limits, out)
            answers = out.alive_at_end and not out.hung and await probe(server, str(box.roots / BYSTANDER))
        _measured(out, server, watch, answers)
    finally:
        server.kill()
        assert server.popen is not None
        server.popen.wait()


def _measured(out: Outcome, server: Server, watch: RssWatch, answers: bool) -> None:
    watch.sample()
    out.over_ceiling, out.exit_note, out.peak_rss_mb = watch.over, server.exit_note(), watch.peak_mb
    out.up = answers and not (out.hung or out.died or out.over_ceiling)


async def _strike(attack: Attack, box: Sandbox, server: Server, attacker: Client, other: Client, limits: Limits,
                  out: Outcome) -> None:
    """The attack's calls while the bystander calls; when the server dies mid-call the client cancels this, and
    the finally clause still records what happened."""
    profile = str(box.roots / BYSTANDER)
    await other.call_tool("load_profile", {"path": profile})
    done, ended, since, t0 = anyio.Event(), anyio.Event(), [time.monotonic()], time.monotonic()

    async def watch_other() -> None:
        await bystander(other, profile, done, out, since)
        ended.set()

    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(watch_other)
            with anyio.move_on_after(limits.wall_s) as scope:
                tasks.start_soon(until_dead, server, scope, out)
                for step in attack.calls:
                    out.answers.append(await call(attacker, box, step, limits.wall_s))
            out.time_s, out.hung = time.monotonic() - t0, scope.cancelled_caught and not out.died
            done.set()
            with anyio.move_on_after(0 if out.hung or out.died else GRACE_S):
                await ended.wait()
            tasks.cancel_scope.cancel()
    finally:
        _ended(attack, server, out, t0, None if ended.is_set() else since[0])


def _ended(attack: Attack, server: Server, out: Outcome, t0: float, in_flight_since: float | None) -> None:
    """What the attack's end leaves to record, whether it ended or was cut off."""
    if not out.time_s:  # cut off: the connection broke
        out.time_s = time.monotonic() - t0
        deadline = time.monotonic() + DYING_S
        while server.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
    out.alive_at_end = server.alive()
    if len(out.answers) < len(attack.calls) and not out.hung:
        out.answers.append(Answer(True, f"the server died{server.exit_note(DYING_S)}" if not out.alive_at_end
                                  else "the connection broke mid-call"))
    if in_flight_since is not None:  # the bystander's call in flight waited at least this long
        out.latencies_s.append(time.monotonic() - in_flight_since)
    if out.hung:
        server.kill()  # before the clients hang up: a hung server would keep them waiting
