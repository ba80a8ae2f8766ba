"""Client: the blocking twin of AsyncClient, with the same methods."""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Union

from . import _calls
from ._calls import Call, ForkResult, Volume
from ._sync_http import SyncConnectionPool
from ._wire import Endpoint
from .client import DEFAULT_TEMPLATE
from .code_interpreter import Execution, ExecutionError, ExecutionStream, HandlerFailed, Result
from .errors import Timeout, TransportError
from .retry import NO_RETRIES, RetryPolicy


class Client:
    """Blocking aenv client; see AsyncClient for what each method does.

    Thread-safe: threads share up to max_connections pooled connections.
    timeout bounds connecting and each socket read (http.client cannot
    bound a whole request).
    """

    def __init__(self, base_url: str = "http://localhost:8000", api_key: str = "", *,
                 timeout: float = 60.0, connect_timeout: float = 10.0, max_connections: int = 100,
                 retry: Optional[RetryPolicy] = None, idle_timeout: float = 20.0):
        self.base_url = base_url
        self._api_key = api_key
        self._timeout = timeout
        self.retry = retry or RetryPolicy()
        self._pool = SyncConnectionPool(Endpoint.parse(base_url), max_connections=max_connections,
                                        connect_timeout=connect_timeout, idle_timeout=idle_timeout)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def close(self) -> None:
        self._pool.close()

    @property
    def connections_opened(self) -> int:
        return self._pool.connections_opened

    def _run(self, call: Call) -> Any:
        policy = self.retry if call.idempotent else NO_RETRIES
        after_lost_answer = False
        for attempt in range(1, policy.max_attempts + 1):
            last = attempt == policy.max_attempts
            try:
                resp = self._pool.send(call.request(self._api_key, self._timeout))
            except Timeout:
                raise
            except TransportError:
                if last:
                    raise
                after_lost_answer = True
                time.sleep(policy.delay(attempt))
                continue
            if policy.retry_status(resp.status) and not last:
                time.sleep(policy.delay(attempt, resp))
                continue
            return call.result(resp, after_lost_answer)
        raise AssertionError("unreachable")

    def create_sandbox(self, template: str = DEFAULT_TEMPLATE, vcpu: Optional[int] = None,
                       memory_mb: Optional[int] = None, timeout_s: Optional[int] = None,
                       auto_pause: bool = False, metadata: Optional[Mapping[str, str]] = None,
                       env_vars: Optional[Mapping[str, str]] = None, network: Any = None,
                       volume_mounts: Optional[Mapping[str, Any]] = None) -> str:
        return self.create_sandbox_info(template, vcpu, memory_mb, timeout_s, auto_pause,
                                        metadata, env_vars, network, volume_mounts)["sandboxID"]

    def create_sandbox_info(self, template: str = DEFAULT_TEMPLATE, vcpu: Optional[int] = None,
                            memory_mb: Optional[int] = None, timeout_s: Optional[int] = None,
                            auto_pause: bool = False, metadata: Optional[Mapping[str, str]] = None,
                            env_vars: Optional[Mapping[str, str]] = None,
                            network: Any = None,
                            volume_mounts: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
        return self._run(_calls.create_sandbox(template, vcpu, memory_mb, timeout_s, auto_pause,
                                               metadata, env_vars, network, volume_mounts))

    def get_sandbox(self, sandbox_id: str) -> Dict[str, Any]:
        return self._run(_calls.get_sandbox(sandbox_id))

    def egress_log(self, sandbox_id: str) -> List[Dict[str, Any]]:
        return self._run(_calls.egress_log(sandbox_id))

    def list_sandboxes(self, state: Optional[Union[str, Iterable[str]]] = None,
                       metadata: Optional[Mapping[str, str]] = None,
                       limit: Optional[int] = None) -> List[Dict[str, Any]]:
        out: List[Dict[str, Any]] = []
        token = None
        while limit is None or len(out) < limit:
            page_size = 100 if limit is None else min(100, limit - len(out))
            page, token = self._run(_calls.list_sandboxes(state, metadata, page_size, token))
            out.extend(page)
            if not token or not page:
                break
        return out

    def set_timeout(self, sandbox_id: str, timeout_s: int) -> None:
        self._run(_calls.set_timeout(sandbox_id, timeout_s))

    def delete_sandbox(self, sandbox_id: str) -> None:
        self._run(_calls.delete_sandbox(sandbox_id))

    def exec_command(self, sandbox_id: str, command: str, cwd: Optional[str] = None,
                     envs: Optional[Mapping[str, str]] = None, timeout: Optional[float] = None,
                     user: Optional[str] = None) -> Dict[str, Any]:
        return self._run(_calls.exec_command(sandbox_id, command, cwd, envs, timeout, user))

    def write_file(self, sandbox_id: str, path: str, content: Union[str, bytes],
                   user: Optional[str] = None) -> None:
        self._run(_calls.write_file(sandbox_id, path, content, user))

    def read_file(self, sandbox_id: str, path: str, binary: bool = False,
                  user: Optional[str] = None) -> Union[str, bytes]:
        return self._run(_calls.read_file(sandbox_id, path, binary, user))

    def _access_token(self, sandbox_id: str, access_token: Optional[str]) -> str:
        if access_token is not None:
            return access_token
        return self.get_sandbox(sandbox_id).get("envdAccessToken") or ""

    def run_code(self, sandbox_id: str, code: str, context_id: Optional[str] = None,
                 language: Optional[str] = None, envs: Optional[Mapping[str, str]] = None,
                 on_stdout: Optional[Callable[[str], Any]] = None,
                 on_stderr: Optional[Callable[[str], Any]] = None,
                 on_result: Optional[Callable[[Result], Any]] = None,
                 on_error: Optional[Callable[[ExecutionError], Any]] = None,
                 timeout: Optional[float] = 300.0, access_token: Optional[str] = None) -> Execution:
        """See AsyncClient.run_code. The handlers are plain functions; the
        timeout (plus the client's) bounds each wait for the code's next
        output rather than the whole run (http.client cannot)."""
        token = self._access_token(sandbox_id, access_token)
        stream = ExecutionStream(on_stdout, on_stderr, on_result, on_error, awaitable_handlers=False)
        call = _calls.run_code(sandbox_id, token, code, context_id, language, envs, timeout, stream)
        try:
            return self._run(call)
        except HandlerFailed as exc:
            raise exc.original from None

    def create_code_context(self, sandbox_id: str, language: Optional[str] = None, cwd: Optional[str] = None,
                            access_token: Optional[str] = None) -> Dict[str, Any]:
        token = self._access_token(sandbox_id, access_token)
        return self._run(_calls.create_code_context(sandbox_id, token, language, cwd))

    def list_code_contexts(self, sandbox_id: str, access_token: Optional[str] = None) -> List[Dict[str, Any]]:
        return self._run(_calls.list_code_contexts(sandbox_id, self._access_token(sandbox_id, access_token)))

    def restart_code_context(self, sandbox_id: str, context_id: str, access_token: Optional[str] = None) -> None:
        self._run(_calls.restart_code_context(sandbox_id, self._access_token(sandbox_id, access_token), context_id))

    def remove_code_context(self, sandbox_id: str, context_id: str, access_token: Optional[str] = None) -> None:
        self._run(_calls.remove_code_context(sandbox_id, self._access_token(sandbox_id, access_token), context_id))

    def update_network(self, sandbox_id: str, network: Any) -> None:
        self._run(_calls.update_network(sandbox_id, network))

    def pause_sandbox(self, sandbox_id: str) -> None:
        self._run(_calls.pause_sandbox(sandbox_id))

    def resume_sandbox(self, sandbox_id: str, timeout_s: Optional[int] = None) -> None:
        self._run(_calls.resume_sandbox(sandbox_id, timeout_s))

    def fork_sandbox(self, sandbox_id: str, count: int = 4, timeout_s: Optional[int] = None,
                     copy_volumes: Optional[Iterable[str]] = None) -> ForkResult:
        result = self._run(_calls.fork_sandbox(sandbox_id, count, timeout_s, copy_volumes))
        if not result and result.errors:
            raise result.errors[0]
        return result

    def create_snapshot(self, sandbox_id: str, name: Optional[str] = None) -> str:
        return self._run(_calls.create_snapshot(sandbox_id, name))

    def list_snapshots(self, sandbox_id: Optional[str] = None, name: Optional[str] = None) -> List[Dict[str, Any]]:
        out: List[Dict[str, Any]] = []
        token = None
        while True:
            page, token = self._run(_calls.list_snapshots(sandbox_id, name, 100, token))
            out.extend(page)
            if not token or not page:
                return out

    def delete_snapshot(self, snapshot_id: str) -> None:
        self._run(_calls.delete_snapshot(snapshot_id))

    def create_template(self, sandbox_id: str, name: str) -> str:
        return self._run(_calls.create_template(sandbox_id, name))

    def create_secret(self, name: str, value: str, metadata: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
        return self._run(_calls.create_secret(name, value, metadata))

    def update_secret(self, id_or_name: str, value: str, metadata: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
        return self._run(_calls.update_secret(id_or_name, value, metadata))

    def get_secret(self, id_or_name: str) -> Dict[str, Any]:
        return self._run(_calls.get_secret(id_or_name))

    def list_secrets(self) -> List[Dict[str, Any]]:
        out: List[Dict[str, Any]] = []
        token = None
        while True:
            page, token = self._run(_calls.list_secrets(100, token))
            out.extend(page)
            if not token or not page:
                return out

    def delete_secret(self, id_or_name: str) -> None:
        self._run(_calls.delete_secret(id_or_name))

    def create_volume(self, name: str, size_mb: Optional[int] = None) -> Volume:
        return self._run(_calls.create_volume(name, size_mb))

    def get_volume(self, id_or_name: str) -> Volume:
        return self._run(_calls.get_volume(id_or_name))

    def list_volumes(self) -> List[Dict[str, Any]]:
        return self._run(_calls.list_volumes())

    def delete_volume(self, id_or_name: str) -> None:
        self._run(_calls.delete_volume(id_or_name))

    def write_volume_file(self, volume: Volume, path: str, content: Union[str, bytes], force: bool = True) -> None:
        self._run(_calls.write_volume_file(volume, path, content, force))

    def read_volume_file(self, volume: Volume, path: str, binary: bool = False) -> Union[str, bytes]:
        return self._run(_calls.read_volume_file(volume, path, binary))
