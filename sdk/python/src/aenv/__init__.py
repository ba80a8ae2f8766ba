"""aenv: Python client and RL environment kit for aenv sandboxes.

    async with aenv.AsyncClient("http://127.0.0.1:8000", api_key) as client:
        sandbox_id = await client.create_sandbox("base")
        result = await client.exec_command(sandbox_id, "echo hi")
        await client.delete_sandbox(sandbox_id)

Standard library only.
"""

from ._calls import ForkResult, Volume
from .client import AsyncClient
from .code_interpreter import Execution, ExecutionError, Logs, Result
from .env import SandboxEnv
from .errors import (AenvError, AuthError, BadRequest, ClientClosed, Conflict, NotFound, SandboxError,
                     Timeout, TransportError, is_infra_error)
from .network import Network
from .retry import RetryPolicy
from .sync_client import Client

__version__ = "0.1.0"

__all__ = [
    "AenvError", "AsyncClient", "AuthError", "BadRequest", "Client", "ClientClosed", "Conflict",
    "Execution", "ExecutionError", "ForkResult", "Logs", "Network", "NotFound", "Result", "RetryPolicy",
    "SandboxEnv", "SandboxError", "Timeout", "TransportError", "Volume", "is_infra_error",
]
