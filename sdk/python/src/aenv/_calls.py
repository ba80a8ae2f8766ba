"""The API calls, as data: both clients build a Call here and run it.

Keeping request building and response decoding in one place means the
async and sync clients cannot drift apart; they differ only in how they
wait.
"""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple, Union

from ._wire import Request, Response
from .code_interpreter import CODE_INTERPRETER_PORT, ExecutionStream
from .errors import AuthError, NotFound, SandboxError, error_from_response

# The server's default command timeout (aenv server --default-exec-timeout-secs);
# an execute without a timeout may legitimately run this long.
SERVER_DEFAULT_EXEC_TIMEOUT = 300.0


@dataclass
class Call:
    method: str
    path: str
    query: Optional[Mapping[str, str]] = None
    json_body: Any = None
    raw_body: Optional[bytes] = None
    idempotent: bool = False
    # added to the client's timeout: time the server may spend working;
    # None: no bound at all
    extra_timeout: Optional[float] = 0.0
    # statuses that count as success when they answer a retry (the first
    # attempt may already have done the work, e.g. DELETE then 404)
    ok_on_retry: Tuple[int, ...] = ()
    decode: Callable[[Response], Any] = field(default=lambda resp: None)
    # a bearer token sent instead of the API key (a volume's content API)
    bearer: Optional[str] = None
    # sandbox traffic (through the server's proxy to a port of a sandbox):
    # these headers are sent instead of the API key, which is not the
    # sandbox's to see
    sandbox_headers: Optional[Mapping[str, str]] = None
    # a streamed answer: a success's body goes to on_body as it arrives
    on_body: Optional[Callable[[bytes], Any]] = None
    # error_for(status, body) may give the exception of an error answer
    # (None: the usual one)
    error_for: Optional[Callable[[int, bytes], Optional[Exception]]] = None

    def request(self, api_key: str, timeout: Optional[float]) -> Request:
        target = self.path
        if self.query:
            target += "?" + urllib.parse.urlencode(self.query)
        headers = {"X-API-Key": api_key, "Accept": "application/json", "User-Agent": "aenv-python"}
        if self.bearer is not None:
            del headers["X-API-Key"]
            headers["Authorization"] = "Bearer " + self.bearer
        if self.sandbox_headers is not None:
            del headers["X-API-Key"]
            headers.update(self.sandbox_headers)
        body = b""
        if self.json_body is not None:
            body = json.dumps(self.json_body).encode()
            headers["Content-Type"] = "application/json"
        elif self.raw_body is not None:
            body = self.raw_body
            headers["Content-Type"] = "application/octet-stream"
        if self.extra_timeout is None:
            timeout = None
        elif timeout is not None:
            timeout += self.extra_timeout
        return Request(self.method, target, headers, body, self.idempotent, timeout, self.on_body)

    def result(self, resp: Response, after_lost_answer: bool) -> Any:
        """Decodes a response, or raises the error it carries.

        after_lost_answer says an earlier attempt failed after it may have
        reached the server."""
        if 200 <= resp.status < 300:
            return self.decode(resp)
        if after_lost_answer and resp.status in self.ok_on_retry:
            return None
        if self.error_for is not None:
            err = self.error_for(resp.status, resp.body)
            if err is not None:
                raise err
        raise error_from_response(resp.status, resp.body)


def _json(resp: Response) -> Any:
    try:
        return json.loads(resp.body)
    except ValueError:
        raise SandboxError(resp.status, f"response is not JSON: {resp.body[:200]!r}") from None


def _key(name: str) -> Callable[[Response], Any]:
    def decode(resp: Response) -> Any:
        data = _json(resp)
        if not isinstance(data, dict) or name not in data:
            raise SandboxError(resp.status, f"response has no {name!r}: {resp.body[:200]!r}")
        return data[name]
    return decode


def _sandbox_path(sandbox_id: str, suffix: str = "") -> str:
    if not sandbox_id:
        raise ValueError("sandbox_id must not be empty")
    return "/sandboxes/" + urllib.parse.quote(sandbox_id, safe="") + suffix


def network_fields(network: Any) -> Dict[str, Any]:
    """The create request's network fields from a Network, a mapping in the
    API's shape, or any object with to_api_request() (the seed's
    NetworkIsolationConfig)."""
    if network is None:
        return {}
    if hasattr(network, "to_api_request"):
        return dict(network.to_api_request())
    if isinstance(network, Mapping):
        return dict(network)
    raise TypeError("network must be aenv.Network, a dict, or have to_api_request()")


def volume_mounts(mounts: Optional[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """The create request's volumeMounts from {path: volume}, where volume
    is a Volume, a volume name or ID, or a dict with "name" and "read_only"."""
    out: List[Dict[str, Any]] = []
    for path, vol in (mounts or {}).items():
        read_only = False
        if isinstance(vol, Volume):
            name = vol.volume_id
        elif isinstance(vol, str):
            name = vol
        elif isinstance(vol, Mapping):
            name, read_only = str(vol["name"]), bool(vol.get("read_only", False))
        else:
            raise TypeError("a volume mount is a Volume, a volume name or ID, or {'name': ..., 'read_only': ...}")
        mount: Dict[str, Any] = {"name": name, "path": path}
        if read_only:
            mount["readOnly"] = True
        out.append(mount)
    return out


def create_sandbox(template: str, vcpu: Optional[int], memory_mb: Optional[int],
                   timeout_s: Optional[int], auto_pause: bool, metadata: Optional[Mapping[str, str]],
                   env_vars: Optional[Mapping[str, str]], network: Any,
                   mounts: Optional[Mapping[str, Any]] = None) -> Call:
    body: Dict[str, Any] = {"templateID": template, "autoPause": bool(auto_pause)}
    if vcpu is not None:
        body["vcpu"] = vcpu
    if memory_mb is not None:
        body["memoryMB"] = memory_mb
    if timeout_s is not None:
        body["timeout"] = int(timeout_s)
    if metadata:
        body["metadata"] = dict(metadata)
    if env_vars:
        body["envVars"] = dict(env_vars)
    body.update(network_fields(network))
    if mounts:
        body["volumeMounts"] = volume_mounts(mounts)
    return Call("POST", "/sandboxes", json_body=body, extra_timeout=60.0, decode=_json)


def get_sandbox(sandbox_id: str) -> Call:
    return Call("GET", _sandbox_path(sandbox_id), idempotent=True, decode=_json)


def egress_log(sandbox_id: str) -> Call:
    return Call("GET", _sandbox_path(sandbox_id) + "/egress", idempotent=True, decode=_json)


def list_sandboxes(state: Optional[Iterable[str]], metadata: Optional[Mapping[str, str]],
                   limit: Optional[int], next_token: Optional[str]) -> Call:
    query: Dict[str, str] = {}
    if state:
        query["state"] = state if isinstance(state, str) else ",".join(state)
    if metadata:
        # E2B's encoding: each key and value, then the whole, then the query.
        pairs = "&".join(f"{urllib.parse.quote(k, safe='')}={urllib.parse.quote(v, safe='')}"
                         for k, v in metadata.items())
        query["metadata"] = urllib.parse.quote(pairs, safe="")
    if limit is not None:
        query["limit"] = str(limit)
    if next_token:
        query["nextToken"] = next_token
    return Call("GET", "/sandboxes", query=query, idempotent=True,
                decode=lambda resp: (_json(resp), resp.header("x-next-token") or None))


def exec_command(sandbox_id: str, command: str, cwd: Optional[str], envs: Optional[Mapping[str, str]],
                 timeout: Optional[float], user: Optional[str]) -> Call:
    body: Dict[str, Any] = {"command": command}
    if cwd:
        body["cwd"] = cwd
    if envs:
        body["envs"] = dict(envs)
    if timeout is not None:
        body["timeout"] = timeout
    if user:
        body["user"] = user
    wait = SERVER_DEFAULT_EXEC_TIMEOUT if timeout is None else float(timeout)
    return Call("POST", _sandbox_path(sandbox_id, "/execute"), json_body=body,
                extra_timeout=wait, decode=_json)


def write_file(sandbox_id: str, path: str, content: Union[str, bytes], user: Optional[str]) -> Call:
    # Writing the same content twice is harmless, so writes are retried.
    if isinstance(content, str):
        body: Dict[str, Any] = {"path": path, "content": content}
        if user:
            body["user"] = user
        return Call("POST", _sandbox_path(sandbox_id, "/files/write"), json_body=body,
                    idempotent=True, extra_timeout=60.0)
    if isinstance(content, (bytes, bytearray, memoryview)):
        query = {"path": path}
        if user:
            query["user"] = user
        return Call("PUT", _sandbox_path(sandbox_id, "/files"), query=query, raw_body=bytes(content),
                    idempotent=True, extra_timeout=60.0)
    raise TypeError("content must be str or bytes")


def read_file(sandbox_id: str, path: str, binary: bool, user: Optional[str]) -> Call:
    query = {"path": path}
    if user:
        query["user"] = user
    if binary:
        return Call("GET", _sandbox_path(sandbox_id, "/files"), query=query, idempotent=True,
                    extra_timeout=60.0, decode=lambda resp: resp.body)
    return Call("GET", _sandbox_path(sandbox_id, "/files/read"), query=query, idempotent=True,
                extra_timeout=60.0, decode=_key("content"))


def update_network(sandbox_id: str, network: Any) -> Call:
    if hasattr(network, "to_update_request"):
        body = dict(network.to_update_request())
    elif isinstance(network, Mapping):
        body = dict(network)
    else:
        raise TypeError("network must be aenv.Network or a dict in the API's shape")
    # Idempotent: the whole policy is replaced.
    return Call("PUT", _sandbox_path(sandbox_id, "/network"), json_body=body, idempotent=True)


def pause_sandbox(sandbox_id: str) -> Call:
    # Not retried: after a lost answer the retry would see 409 "paused".
    return Call("POST", _sandbox_path(sandbox_id, "/pause"), extra_timeout=60.0)


def resume_sandbox(sandbox_id: str, timeout_s: Optional[int]) -> Call:
    # Through E2B's connect, which is idempotent: a paused sandbox is
    # resumed (201), a running one answers 200 (its deadline is extended,
    # never shortened); so resume can be retried. The seed's POST .../resume
    # answers 409 for a running sandbox instead.
    body = {"timeout": int(timeout_s)} if timeout_s is not None else {}
    return Call("POST", "/v2" + _sandbox_path(sandbox_id, "/connect"), json_body=body, idempotent=True,
                extra_timeout=60.0, decode=lambda resp: _json(resp) if resp.body.strip() else {})


class ForkResult(List[str]):
    """The child sandbox IDs of a fork, in order; a list, as the seed's
    client returned. errors holds a SandboxError per child that failed,
    and sandboxes the server's full record of each child created."""

    def __init__(self, ids: Iterable[str], errors: Iterable[SandboxError] = (),
                 sandboxes: Iterable[Dict[str, Any]] = ()):
        super().__init__(ids)
        self.errors: List[SandboxError] = list(errors)
        self.sandboxes: List[Dict[str, Any]] = list(sandboxes)


def _decode_fork(resp: Response) -> ForkResult:
    data = _json(resp)
    if isinstance(data, dict) and isinstance(data.get("childSandboxIDs"), list):
        return ForkResult(data["childSandboxIDs"])  # the seed's shape
    if not isinstance(data, list):
        raise SandboxError(resp.status, f"unexpected fork response: {resp.body[:200]!r}")
    ids, errors, records = [], [], []
    for item in data:
        sandbox = item.get("sandbox") if isinstance(item, dict) else None
        if isinstance(sandbox, dict) and sandbox.get("sandboxID"):
            ids.append(sandbox["sandboxID"])
            records.append(sandbox)
            continue
        err = item.get("error") if isinstance(item, dict) else None
        err = err if isinstance(err, dict) else {}
        status = err.get("code") if isinstance(err.get("code"), int) else 500
        errors.append(error_from_response(status, json.dumps({"message": str(err.get("message", item))}).encode()))
    return ForkResult(ids, errors, records)


def fork_sandbox(sandbox_id: str, count: int, timeout_s: Optional[int],
                 copy_volumes: Optional[Iterable[str]] = None) -> Call:
    body: Dict[str, Any] = {"count": int(count)}
    if timeout_s is not None:
        body["timeout"] = int(timeout_s)
    if copy_volumes:
        body["volumes"] = {path: "copy" for path in copy_volumes}
    return Call("POST", _sandbox_path(sandbox_id, "/fork"), json_body=body,
                extra_timeout=60.0 + 5.0 * count, decode=_decode_fork)


def create_snapshot(sandbox_id: str, name: Optional[str]) -> Call:
    body = {"name": name} if name else {}
    return Call("POST", _sandbox_path(sandbox_id, "/snapshots"), json_body=body,
                extra_timeout=120.0, decode=_key("snapshotID"))


def list_snapshots(sandbox_id: Optional[str], name: Optional[str], limit: Optional[int],
                   next_token: Optional[str]) -> Call:
    query: Dict[str, str] = {}
    if sandbox_id:
        query["sandboxID"] = sandbox_id
    if name:
        query["name"] = name
    if limit is not None:
        query["limit"] = str(limit)
    if next_token:
        query["nextToken"] = next_token
    return Call("GET", "/snapshots", query=query, idempotent=True,
                decode=lambda resp: (_json(resp), resp.header("x-next-token") or None))


def delete_snapshot(snapshot_id: str) -> Call:
    return Call("DELETE", "/templates/" + urllib.parse.quote(snapshot_id, safe=""),
                idempotent=True, ok_on_retry=(404,))


def create_template(sandbox_id: str, name: str) -> Call:
    return Call("POST", "/templates", json_body={"sandboxID": sandbox_id, "name": name},
                extra_timeout=120.0, decode=_key("templateID"))


def set_timeout(sandbox_id: str, timeout_s: int) -> Call:
    # Idempotent: a repeat sets the same deadline, measured from a moment later.
    return Call("POST", _sandbox_path(sandbox_id, "/timeout"), json_body={"timeout": int(timeout_s)},
                idempotent=True)


def delete_sandbox(sandbox_id: str) -> Call:
    return Call("DELETE", _sandbox_path(sandbox_id), idempotent=True, ok_on_retry=(404,), extra_timeout=30.0)


# --- secrets ---

def _secret_path(id_or_name: str) -> str:
    if not id_or_name:
        raise ValueError("secret must not be empty")
    return "/secrets/" + urllib.parse.quote(id_or_name, safe="")


def create_secret(name: str, value: str, metadata: Optional[Mapping[str, str]]) -> Call:
    body: Dict[str, Any] = {"name": name, "value": value}
    if metadata is not None:
        body["metadata"] = dict(metadata)
    return Call("POST", "/secrets", json_body=body, decode=_json)


def update_secret(id_or_name: str, value: str, metadata: Optional[Mapping[str, str]]) -> Call:
    body: Dict[str, Any] = {"value": value}
    if metadata is not None:
        body["metadata"] = dict(metadata)
    # Not idempotent: a repeat makes another version.
    return Call("POST", _secret_path(id_or_name), json_body=body, decode=_json)


def get_secret(id_or_name: str) -> Call:
    return Call("GET", _secret_path(id_or_name), idempotent=True, decode=_json)


def list_secrets(limit: int, next_token: Optional[str]) -> Call:
    query = {"limit": str(limit)}
    if next_token:
        query["nextToken"] = next_token
    return Call("GET", "/secrets", query=query, idempotent=True,
                decode=lambda resp: (_json(resp), resp.header("x-next-token") or None))


def delete_secret(id_or_name: str) -> Call:
    return Call("DELETE", _secret_path(id_or_name), idempotent=True, ok_on_retry=(404,))


# --- volumes ---

@dataclass(frozen=True)
class Volume:
    """A persistent volume: mount it with create_sandbox(volume_mounts=...),
    read and write its files without a sandbox with the token."""
    volume_id: str
    name: str
    token: str
    # The most its files may take, in MiB (0: no bound; only a server with
    # a volume pool bounds volumes).
    size_mb: int = 0


def _volume(resp: Response) -> Volume:
    data = _json(resp)
    try:
        return Volume(data["volumeID"], data["name"], data["token"], int(data.get("sizeMB") or 0))
    except (KeyError, TypeError):
        raise SandboxError(resp.status, f"not a volume: {resp.body[:200]!r}") from None


def _volume_path(id_or_name: str) -> str:
    if not id_or_name:
        raise ValueError("volume must not be empty")
    return "/volumes/" + urllib.parse.quote(id_or_name, safe="")


def create_volume(name: str, size_mb: Optional[int] = None) -> Call:
    body: Dict[str, Any] = {"name": name}
    if size_mb is not None:
        body["sizeMB"] = size_mb
    return Call("POST", "/volumes", json_body=body, decode=_volume)


def get_volume(id_or_name: str) -> Call:
    return Call("GET", _volume_path(id_or_name), idempotent=True, decode=_volume)


def list_volumes() -> Call:
    return Call("GET", "/volumes", idempotent=True, decode=_json)


def delete_volume(id_or_name: str) -> Call:
    return Call("DELETE", _volume_path(id_or_name), idempotent=True, ok_on_retry=(404,))


def write_volume_file(volume: Volume, path: str, content: Union[str, bytes], force: bool) -> Call:
    data = content.encode() if isinstance(content, str) else bytes(content)
    query = {"path": path}
    if force:
        query["force"] = "true"
    return Call("PUT", "/volumecontent/" + urllib.parse.quote(volume.volume_id, safe="") + "/file",
                query=query, raw_body=data, idempotent=True, bearer=volume.token, decode=_json)


def read_volume_file(volume: Volume, path: str, binary: bool) -> Call:
    def decode(resp: Response) -> Union[str, bytes]:
        return resp.body if binary else resp.body.decode()
    return Call("GET", "/volumecontent/" + urllib.parse.quote(volume.volume_id, safe="") + "/file",
                query={"path": path}, idempotent=True, bearer=volume.token, decode=decode)


# --- the code interpreter (port 49999 of a code-interpreter sandbox) ---

def _code_interpreter_error(sandbox_id: str) -> Callable[[int, bytes], Optional[Exception]]:
    """The proxy's answers in words of the code interpreter: no such
    sandbox, nothing on the port, a wrong access token."""
    def error_for(status: int, body: bytes) -> Optional[Exception]:
        try:
            data = json.loads(body)
        except ValueError:
            data = None
        data = data if isinstance(data, dict) else {}
        if status == 502 and data.get("port") is not None:
            return NotFound(status, f"sandbox {sandbox_id} does not serve the code interpreter: nothing listens "
                                    f"on port {CODE_INTERPRETER_PORT} (create it from the code-interpreter template)")
        if status == 502:
            return NotFound(status, f"sandbox {sandbox_id} not found or not running")
        if status == 401:
            return AuthError(status, f"the code interpreter of sandbox {sandbox_id} refused its access token "
                                     f"({data.get('message') or 'HTTP 401'})")
        return None
    return error_for


def _code_interpreter_call(method: str, path: str, sandbox_id: str, access_token: Optional[str],
                           **kwargs: Any) -> Call:
    if not sandbox_id:
        raise ValueError("sandbox_id must not be empty")
    headers = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": str(CODE_INTERPRETER_PORT)}
    if access_token:
        headers["X-Access-Token"] = access_token
    return Call(method, path, sandbox_headers=headers, error_for=_code_interpreter_error(sandbox_id), **kwargs)


def run_code(sandbox_id: str, access_token: Optional[str], code: str, context_id: Optional[str],
             language: Optional[str], envs: Optional[Mapping[str, str]], timeout: Optional[float],
             stream: ExecutionStream) -> Call:
    if not isinstance(code, str) or not code.strip():
        raise ValueError("code must not be empty")
    if context_id and language:
        raise ValueError("give context_id or language, not both")
    body: Dict[str, Any] = {"code": code}
    if context_id:
        body["context_id"] = context_id
    if language:
        body["language"] = language
    if envs:
        body["env_vars"] = dict(envs)
    # Never retried: the code may have run. The timeout bounds the run:
    # when it passes the connection is closed and the code interrupted.
    return _code_interpreter_call("POST", "/execute", sandbox_id, access_token, json_body=body,
                                  extra_timeout=timeout, on_body=stream.feed,
                                  decode=lambda resp: stream.finish())


def create_code_context(sandbox_id: str, access_token: Optional[str], language: Optional[str],
                        cwd: Optional[str]) -> Call:
    body: Dict[str, Any] = {}
    if language:
        body["language"] = language
    if cwd:
        body["cwd"] = cwd
    return _code_interpreter_call("POST", "/contexts", sandbox_id, access_token, json_body=body,
                                  extra_timeout=60.0, decode=_json)


def list_code_contexts(sandbox_id: str, access_token: Optional[str]) -> Call:
    return _code_interpreter_call("GET", "/contexts", sandbox_id, access_token, idempotent=True, decode=_json)


def _context_path(context_id: str, suffix: str = "") -> str:
    if not context_id:
        raise ValueError("context_id must not be empty")
    return "/contexts/" + urllib.parse.quote(context_id, safe="") + suffix


def restart_code_context(sandbox_id: str, access_token: Optional[str], context_id: str) -> Call:
    return _code_interpreter_call("POST", _context_path(context_id, "/restart"), sandbox_id, access_token,
                                  extra_timeout=60.0)


def remove_code_context(sandbox_id: str, access_token: Optional[str], context_id: str) -> Call:
    return _code_interpreter_call("DELETE", _context_path(context_id), sandbox_id, access_token,
                                  idempotent=True, ok_on_retry=(404,))
