"""AsyncClient: the asyncio client of the aenv API (the seed's AgentENVClient)."""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Union

from . import _calls
from ._async_http import AsyncConnectionPool
from ._calls import Call, ForkResult, Volume
from ._wire import Endpoint
from .code_interpreter import Execution, ExecutionError, ExecutionStream, HandlerFailed, Result
from .errors import Timeout, TransportError
from .retry import NO_RETRIES, RetryPolicy

DEFAULT_TEMPLATE = "base"


class AsyncClient:
    """Talks to one aenv server. Use as `async with AsyncClient(...) as c:`.

    base_url: e.g. "http://127.0.0.1:8000". api_key: sent as X-API-Key.
    timeout: seconds for one request, connect to last byte; calls that make
    the server work longer (execute, create, fork, snapshot) get that work
    time added. connect_timeout: seconds to open a connection.
    max_connections: sockets kept to the server; more concurrent calls
    queue for one. retry: the RetryPolicy of idempotent calls.

    One client belongs to one event loop. Methods may be called
    concurrently from many tasks: that is the intended use.
    """

    def __init__(self, base_url: str = "http://localhost:8000", api_key: str = "", *,
                 timeout: float = 60.0, connect_timeout: float = 10.0, max_connections: int = 100,
                 retry: Optional[RetryPolicy] = None, idle_timeout: float = 20.0):
        self.base_url = base_url
        self._api_key = api_key
        self._timeout = timeout
        self.retry = retry or RetryPolicy()
        self._pool = AsyncConnectionPool(Endpoint.parse(base_url), max_connections=max_connections,
                                         connect_timeout=connect_timeout, idle_timeout=idle_timeout)

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    async def close(self) -> None:
        """Closes the pooled connections. Calls after close raise ClientClosed."""
        await self._pool.close()

    @property
    def connections_opened(self) -> int:
        """How many TCP connections the client has opened so far."""
        return self._pool.connections_opened

    async def _run(self, call: Call) -> Any:
        policy = self.retry if call.idempotent else NO_RETRIES
        after_lost_answer = False
        for attempt in range(1, policy.max_attempts + 1):
            last = attempt == policy.max_attempts
            try:
                resp = await self._pool.send(call.request(self._api_key, self._timeout))
            except Timeout:
                raise
            except TransportError:
                if last:
                    raise
                after_lost_answer = True
                await asyncio.sleep(policy.delay(attempt))
                continue
            if policy.retry_status(resp.status) and not last:
                await asyncio.sleep(policy.delay(attempt, resp))
                continue
            return call.result(resp, after_lost_answer)
        raise AssertionError("unreachable")

    # --- sandboxes ---

    async def create_sandbox(self, template: str = DEFAULT_TEMPLATE, vcpu: Optional[int] = None,
                             memory_mb: Optional[int] = None, timeout_s: Optional[int] = None,
                             auto_pause: bool = False, metadata: Optional[Mapping[str, str]] = None,
                             env_vars: Optional[Mapping[str, str]] = None, network: Any = None,
                             volume_mounts: Optional[Mapping[str, Any]] = None) -> str:
        """Starts a sandbox from a template or snapshot (ID or name); returns its ID.

        vcpu, memory_mb and timeout_s (lifetime in seconds) default to the
        server's settings. auto_pause pauses instead of killing at the
        deadline. network: aenv.Network, or a dict with allowInternetAccess /
        alwaysDeniedCIDRs / alwaysAllowedCIDRs. volume_mounts: {path: volume},
        volume being an aenv.Volume, a volume name or ID, or {"name": ...,
        "read_only": True}. Never retried.
        """
        info = await self.create_sandbox_info(template, vcpu, memory_mb, timeout_s, auto_pause,
                                              metadata, env_vars, network, volume_mounts)
        return info["sandboxID"]

    async def create_sandbox_info(self, template: str = DEFAULT_TEMPLATE, vcpu: Optional[int] = None,
                                  memory_mb: Optional[int] = None, timeout_s: Optional[int] = None,
                                  auto_pause: bool = False, metadata: Optional[Mapping[str, str]] = None,
                                  env_vars: Optional[Mapping[str, str]] = None,
                                  network: Any = None,
                                  volume_mounts: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
        """create_sandbox, returning the server's whole record (sandboxID,
        templateID, envdVersion, envdAccessToken, ...)."""
        return await self._run(_calls.create_sandbox(template, vcpu, memory_mb, timeout_s, auto_pause,
                                                     metadata, env_vars, network, volume_mounts))

    async def get_sandbox(self, sandbox_id: str) -> Dict[str, Any]:
        """The sandbox's record: sandboxID, state, startedAt, endAt, cpuCount, memoryMB, metadata, ..."""
        return await self._run(_calls.get_sandbox(sandbox_id))

    async def egress_log(self, sandbox_id: str) -> List[Dict[str, Any]]:
        """The node's egress log of the sandbox, oldest first: connections
        judged by host name (protocol, host, verdict, rule, reason, bytesOut,
        bytesIn, ...) and DNS queries refused."""
        return await self._run(_calls.egress_log(sandbox_id))

    async def list_sandboxes(self, state: Optional[Union[str, Iterable[str]]] = None,
                             metadata: Optional[Mapping[str, str]] = None,
                             limit: Optional[int] = None) -> List[Dict[str, Any]]:
        """Sandboxes in the given states (default running and paused) whose
        metadata contains every given key=value; all pages, up to limit."""
        out: List[Dict[str, Any]] = []
        token = None
        while limit is None or len(out) < limit:
            page_size = 100 if limit is None else min(100, limit - len(out))
            page, token = await self._run(_calls.list_sandboxes(state, metadata, page_size, token))
            out.extend(page)
            if not token or not page:
                break
        return out

    async def set_timeout(self, sandbox_id: str, timeout_s: int) -> None:
        """Sets the sandbox's deadline to timeout_s seconds from now."""
        await self._run(_calls.set_timeout(sandbox_id, timeout_s))

    async def delete_sandbox(self, sandbox_id: str) -> None:
        """Kills the sandbox and frees its resources. NotFound if unknown."""
        await self._run(_calls.delete_sandbox(sandbox_id))

    # --- commands and files ---

    async def exec_command(self, sandbox_id: str, command: str, cwd: Optional[str] = None,
                           envs: Optional[Mapping[str, str]] = None, timeout: Optional[float] = None,
                           user: Optional[str] = None) -> Dict[str, Any]:
        """Runs a shell command (bash -c) and waits for it.

        Returns {"exitCode", "stdout", "stderr"} plus "timedOut": true when
        the command ran past timeout seconds and was killed. A non-zero exit
        is a result, not an exception. Never retried.
        """
        return await self._run(_calls.exec_command(sandbox_id, command, cwd, envs, timeout, user))

    async def write_file(self, sandbox_id: str, path: str, content: Union[str, bytes],
                         user: Optional[str] = None) -> None:
        """Writes content to the absolute path, creating parent directories.
        str is written as UTF-8 text; bytes are sent raw."""
        await self._run(_calls.write_file(sandbox_id, path, content, user))

    async def read_file(self, sandbox_id: str, path: str, binary: bool = False,
                        user: Optional[str] = None) -> Union[str, bytes]:
        """The file's content: str (UTF-8) by default, bytes if binary."""
        return await self._run(_calls.read_file(sandbox_id, path, binary, user))

    # --- the code interpreter ---

    async def _access_token(self, sandbox_id: str, access_token: Optional[str]) -> str:
        if access_token is not None:
            return access_token
        return (await self.get_sandbox(sandbox_id)).get("envdAccessToken") or ""

    async def run_code(self, sandbox_id: str, code: str, context_id: Optional[str] = None,
                       language: Optional[str] = None, envs: Optional[Mapping[str, str]] = None,
                       on_stdout: Optional[Callable[[str], Any]] = None,
                       on_stderr: Optional[Callable[[str], Any]] = None,
                       on_result: Optional[Callable[[Result], Any]] = None,
                       on_error: Optional[Callable[[ExecutionError], Any]] = None,
                       timeout: Optional[float] = 300.0, access_token: Optional[str] = None) -> Execution:
        """Runs code in the code interpreter of a sandbox made from the
        code-interpreter template (E2B's runCode): variables, imports and
        definitions stay for the next run in the same context.

        The code runs in the default Python context, or in context_id (see
        create_code_context), or in the default context of language. envs
        apply to this run only. The handlers are called as the code prints
        (on_stdout, on_stderr: the text), produces results (on_result: a
        Result) or raises (on_error: an ExecutionError); they may be
        coroutine functions. Returns an aenv.Execution (results, logs, error,
        text); an exception in the code is its error, not raised. timeout
        is how long the code may run, in seconds (the client's timeout is
        added; None: no bound): past it the code is interrupted (its context
        keeps its state) and aenv.Timeout raised.

        access_token is the sandbox's envdAccessToken (create_sandbox_info);
        without it get_sandbox fetches it first. NotFound for an unknown
        sandbox, a sandbox without the code interpreter or an unknown
        context; BadRequest for a language it does not run. Never retried.
        """
        token = await self._access_token(sandbox_id, access_token)
        stream = ExecutionStream(on_stdout, on_stderr, on_result, on_error)
        call = _calls.run_code(sandbox_id, token, code, context_id, language, envs, timeout, stream)
        try:
            return await self._run(call)
        except HandlerFailed as exc:
            raise exc.original from None

    async def create_code_context(self, sandbox_id: str, language: Optional[str] = None,
                                  cwd: Optional[str] = None, access_token: Optional[str] = None) -> Dict[str, Any]:
        """Starts a context (a process keeping its own state) in the code
        interpreter; returns {"id", "language", "cwd"}. Pass its id as
        run_code's context_id."""
        token = await self._access_token(sandbox_id, access_token)
        return await self._run(_calls.create_code_context(sandbox_id, token, language, cwd))

    async def list_code_contexts(self, sandbox_id: str, access_token: Optional[str] = None) -> List[Dict[str, Any]]:
        """The code interpreter's contexts: [{"id", "language", "cwd"}]."""
        token = await self._access_token(sandbox_id, access_token)
        return await self._run(_calls.list_code_contexts(sandbox_id, token))

    async def restart_code_context(self, sandbox_id: str, context_id: str,
                                   access_token: Optional[str] = None) -> None:
        """Starts the context's process again: its state is lost, a run in it ends."""
        token = await self._access_token(sandbox_id, access_token)
        await self._run(_calls.restart_code_context(sandbox_id, token, context_id))

    async def remove_code_context(self, sandbox_id: str, context_id: str,
                                  access_token: Optional[str] = None) -> None:
        """Stops the context's process and forgets the context."""
        token = await self._access_token(sandbox_id, access_token)
        await self._run(_calls.remove_code_context(sandbox_id, token, context_id))

    # --- lifecycle ---

    async def update_network(self, sandbox_id: str, network: Any) -> None:
        """Replaces the sandbox's egress policy (aenv.Network, or a dict with
        allowOut / denyOut / allowInternetAccess / egressProxy); new
        connections follow it at once."""
        await self._run(_calls.update_network(sandbox_id, network))

    async def pause_sandbox(self, sandbox_id: str) -> None:
        """Pauses the sandbox, keeping memory and files. Conflict if already paused."""
        await self._run(_calls.pause_sandbox(sandbox_id))

    async def resume_sandbox(self, sandbox_id: str, timeout_s: Optional[int] = None) -> None:
        """Resumes a paused sandbox (a running one is left running)."""
        await self._run(_calls.resume_sandbox(sandbox_id, timeout_s))

    async def fork_sandbox(self, sandbox_id: str, count: int = 4,
                           timeout_s: Optional[int] = None,
                           copy_volumes: Optional[Iterable[str]] = None) -> ForkResult:
        """Forks count children with the sandbox's memory, processes and files.

        Returns the child IDs (a list). Children that failed are in the
        result's .errors; if none succeeded the first error is raised.
        The children share the sandbox's volumes, except those mounted at
        the paths in copy_volumes: each child gets its own copy-on-write
        copy of those. Never retried.
        """
        result = await self._run(_calls.fork_sandbox(sandbox_id, count, timeout_s, copy_volumes))
        if not result and result.errors:
            raise result.errors[0]
        return result

    async def create_snapshot(self, sandbox_id: str, name: Optional[str] = None) -> str:
        """Captures the sandbox's state; returns the snapshot ID. Sandboxes
        created with template=<snapshot ID or name> start from it."""
        return await self._run(_calls.create_snapshot(sandbox_id, name))

    async def list_snapshots(self, sandbox_id: Optional[str] = None,
                             name: Optional[str] = None) -> List[Dict[str, Any]]:
        """Snapshots ({"snapshotID", "names"}), all pages."""
        out: List[Dict[str, Any]] = []
        token = None
        while True:
            page, token = await self._run(_calls.list_snapshots(sandbox_id, name, 100, token))
            out.extend(page)
            if not token or not page:
                return out

    async def delete_snapshot(self, snapshot_id: str) -> None:
        await self._run(_calls.delete_snapshot(snapshot_id))

    async def create_template(self, sandbox_id: str, name: str) -> str:
        """Makes a template from the sandbox's current state; returns its ID."""
        return await self._run(_calls.create_template(sandbox_id, name))

    # --- secrets ---

    async def create_secret(self, name: str, value: str,
                            metadata: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
        """Makes a secret the egress gateway sets into requests (network rules'
        ${e2b.secrets.NAME}); returns its record, never the value. Never retried."""
        return await self._run(_calls.create_secret(name, value, metadata))

    async def update_secret(self, id_or_name: str, value: str,
                            metadata: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
        """Makes value the secret's next version; metadata, when given, replaces its own."""
        return await self._run(_calls.update_secret(id_or_name, value, metadata))

    async def get_secret(self, id_or_name: str) -> Dict[str, Any]:
        """A secret's record: {"secretID", "name", "currentVersion", "metadata", ...}."""
        return await self._run(_calls.get_secret(id_or_name))

    async def list_secrets(self) -> List[Dict[str, Any]]:
        """The team's secrets, oldest first, all pages."""
        out: List[Dict[str, Any]] = []
        token = None
        while True:
            page, token = await self._run(_calls.list_secrets(100, token))
            out.extend(page)
            if not token or not page:
                return out

    async def delete_secret(self, id_or_name: str) -> None:
        """Destroys a secret and every version of its value."""
        await self._run(_calls.delete_secret(id_or_name))

    # --- volumes ---

    async def create_volume(self, name: str, size_mb: Optional[int] = None) -> Volume:
        """Makes a persistent volume (a name unique in the team), of size_mb
        MiB at most (default: the server's; only a server with a volume pool
        bounds volumes, and one without refuses size_mb). Never retried."""
        return await self._run(_calls.create_volume(name, size_mb))

    async def get_volume(self, id_or_name: str) -> Volume:
        return await self._run(_calls.get_volume(id_or_name))

    async def list_volumes(self) -> List[Dict[str, Any]]:
        """The team's volumes: [{"volumeID", "name"}]."""
        return await self._run(_calls.list_volumes())

    async def delete_volume(self, id_or_name: str) -> None:
        """Deletes a volume and its files. Conflict while a sandbox mounts it."""
        await self._run(_calls.delete_volume(id_or_name))

    async def write_volume_file(self, volume: Volume, path: str, content: Union[str, bytes],
                                force: bool = True) -> None:
        """Writes a file in the volume, without a sandbox (force makes missing
        parent directories)."""
        await self._run(_calls.write_volume_file(volume, path, content, force))

    async def read_volume_file(self, volume: Volume, path: str, binary: bool = False) -> Union[str, bytes]:
        return await self._run(_calls.read_volume_file(volume, path, binary))
