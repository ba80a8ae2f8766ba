"""SandboxEnv: a gym-style RL environment over one aenv sandbox.

Actions are shell commands; rewards come from a function the user gives.
Infrastructure failures (the sandbox died, a create or fork failed, the
server was unreachable) never raise out of reset(), step() or fork():
they end the episode with info["infra_error"] = True, so a trainer can
mask the trajectory out of its group statistics instead of scoring it 0.
Caller mistakes (a bad template name, a malformed request) do raise.
"""

from __future__ import annotations

import inspect
import time
from typing import Any, Awaitable, Callable, Dict, List, Optional, Tuple, Union

from .client import DEFAULT_TEMPLATE, AsyncClient
from .code_interpreter import Execution
from .errors import NotFound, SandboxError, is_infra_error

ExecResult = Dict[str, Any]
# reward_fn(action, result, env) -> float; done_fn(action, result, env) -> bool;
# observe(env, result) -> observation (result is None after reset). Each
# may be a plain function or a coroutine function.
RewardFn = Callable[[str, ExecResult, "SandboxEnv"], Union[float, Awaitable[float]]]
DoneFn = Callable[[str, ExecResult, "SandboxEnv"], Union[bool, Awaitable[bool]]]
ObserveFn = Callable[["SandboxEnv", Optional[ExecResult]], Any]
# setup(env) prepares a new sandbox before the first observation.
SetupFn = Callable[["SandboxEnv"], Awaitable[None]]

StepResult = Tuple[Any, float, bool, Dict[str, Any]]


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _zero_reward(action: str, result: ExecResult, env: "SandboxEnv") -> float:
    return 0.0


def _never_done(action: str, result: ExecResult, env: "SandboxEnv") -> bool:
    return False


class SandboxEnv:
    """One episode at a time in one sandbox.

    client: the AsyncClient to use (shared by many envs).
    template: template to start from; snapshot, if given, wins: reset()
    then starts from that exact captured state.
    reward_fn, done_fn: score and end an episode from each step's result.
    observe: a shell command whose stdout is the observation, or a
    function (env, result) -> observation; by default the observation is
    the action's stdout + stderr ("" after reset).
    max_steps: episode length limit (then done, info["truncated"]).
    step_timeout: seconds a command may run before it is killed.
    cwd: working directory of commands. create_kwargs: extra arguments of
    create_sandbox (vcpu, memory_mb, timeout_s, metadata, network, ...).
    setup: async function(env) run by reset() after the create and before
    the first observation (write the task's files, install things); not
    run in fork children, which inherit its effects.
    """

    def __init__(self, client: AsyncClient, template: str = DEFAULT_TEMPLATE, *,
                 snapshot: Optional[str] = None, reward_fn: Optional[RewardFn] = None,
                 done_fn: Optional[DoneFn] = None, observe: Union[str, ObserveFn, None] = None,
                 max_steps: Optional[int] = None, step_timeout: Optional[float] = None,
                 cwd: Optional[str] = None, create_kwargs: Optional[Dict[str, Any]] = None,
                 setup: Optional[SetupFn] = None):
        self.client = client
        self.template = template
        self.from_snapshot = snapshot
        self.reward_fn = reward_fn or _zero_reward
        self.done_fn = done_fn or _never_done
        self.observe = observe
        self.max_steps = max_steps
        self.step_timeout = step_timeout
        self.cwd = cwd
        self.create_kwargs = dict(create_kwargs or {})
        self.setup = setup
        self.sandbox_id: Optional[str] = None
        self.steps = 0
        self.done = False
        # the infrastructure failure that broke this env, if any
        self.infra_error: Optional[BaseException] = None
        self.reset_info: Dict[str, Any] = {}

    def _sibling(self, sandbox_id: Optional[str], infra_error: Optional[BaseException]) -> "SandboxEnv":
        child = SandboxEnv(self.client, self.template, snapshot=self.from_snapshot, reward_fn=self.reward_fn,
                           done_fn=self.done_fn, observe=self.observe, max_steps=self.max_steps,
                           step_timeout=self.step_timeout, cwd=self.cwd, create_kwargs=self.create_kwargs,
                           setup=self.setup)
        child.sandbox_id = sandbox_id
        child.steps = self.steps
        child.infra_error = infra_error
        child.done = infra_error is not None
        return child

    async def __aenter__(self) -> "SandboxEnv":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    async def reset(self) -> Any:
        """Starts a fresh episode in a new sandbox; returns the first observation.

        The previous sandbox, if any, is deleted. If the create fails for
        infrastructure reasons, returns None with reset_info["infra_error"]
        set, and the next step() ends the episode the same way.
        """
        await self.close()
        self.steps, self.done, self.infra_error = 0, False, None
        start = time.monotonic()
        try:
            self.sandbox_id = await self.client.create_sandbox(self.from_snapshot or self.template,
                                                               **self.create_kwargs)
        except NotFound:
            raise  # no such template or snapshot: the caller's mistake
        except Exception as exc:
            if not is_infra_error(exc):
                raise
            return self._broken_reset(exc, start)
        self.reset_info = {"sandbox_id": self.sandbox_id, "infra_error": False,
                           "create_seconds": time.monotonic() - start}
        try:
            if self.setup is not None:
                await self.setup(self)
                self.reset_info["setup_seconds"] = time.monotonic() - start - self.reset_info["create_seconds"]
            return await self._observe(None)
        except Exception as exc:
            if not is_infra_error(exc):
                raise
            self.infra_error, self.done = exc, True
            self.reset_info.update(infra_error=True, error=str(exc))
            return None

    def _broken_reset(self, exc: BaseException, start: float) -> None:
        self.infra_error, self.done = exc, True
        self.reset_info = {"sandbox_id": None, "infra_error": True, "error": str(exc),
                           "create_seconds": time.monotonic() - start}
        return None

    async def step(self, action: str) -> StepResult:
        """Runs action as a shell command: (observation, reward, done, info).

        info holds exit_code, stdout, stderr, timed_out, step, sandbox_id,
        exec_seconds, infra_error (False), and truncated when max_steps
        ended the episode. On an infrastructure failure the result is
        (None, 0.0, True, {"infra_error": True, "error": ..., ...}).
        """
        if self.infra_error is not None:
            return None, 0.0, True, self._infra_info(self.infra_error)
        if self.sandbox_id is None:
            raise RuntimeError("step() before reset()")
        if self.done:
            raise RuntimeError("step() after the episode ended; call reset()")
        self.steps += 1
        start = time.monotonic()
        try:
            result = await self.client.exec_command(self.sandbox_id, action, cwd=self.cwd,
                                                    timeout=self.step_timeout)
            exec_seconds = time.monotonic() - start
            observation = await self._observe(result)
        except Exception as exc:
            if not is_infra_error(exc):
                raise
            self.infra_error, self.done = exc, True
            return None, 0.0, True, self._infra_info(exc)
        reward = float(await _maybe_await(self.reward_fn(action, result, self)))
        done = bool(await _maybe_await(self.done_fn(action, result, self)))
        truncated = not done and self.max_steps is not None and self.steps >= self.max_steps
        self.done = done or truncated
        info = {"exit_code": result.get("exitCode"), "stdout": result.get("stdout", ""),
                "stderr": result.get("stderr", ""), "timed_out": bool(result.get("timedOut")),
                "step": self.steps, "sandbox_id": self.sandbox_id, "exec_seconds": exec_seconds,
                "infra_error": False, "truncated": truncated}
        return observation, reward, self.done, info

    def _infra_info(self, exc: BaseException) -> Dict[str, Any]:
        return {"infra_error": True, "error": str(exc), "exception": exc,
                "step": self.steps, "sandbox_id": self.sandbox_id}

    async def _observe(self, result: Optional[ExecResult]) -> Any:
        if callable(self.observe):
            return await _maybe_await(self.observe(self, result))
        if isinstance(self.observe, str):
            out = await self.client.exec_command(self.sandbox_id, self.observe, cwd=self.cwd,
                                                 timeout=self.step_timeout)
            return out.get("stdout", "")
        if result is None:
            return ""
        return result.get("stdout", "") + result.get("stderr", "")

    async def fork(self, n: int) -> List["SandboxEnv"]:
        """n environments sharing this one's current state (memory, processes,
        files, step count), each in its own sandbox.

        Always returns n envs: a child the server could not make comes back
        already done, with infra_error set, and its step() reports it. Raises
        if the server refuses the fork itself (no fork support: NotFound or
        501; a bad count: BadRequest; a paused parent it cannot fork: Conflict).
        """
        if self.sandbox_id is None or self.infra_error is not None:
            raise RuntimeError("fork() needs a live sandbox: call reset() first")
        try:
            result = await self.client.fork_sandbox(self.sandbox_id, n)
        except SandboxError as exc:
            if exc.status == 404 or not is_infra_error(exc):
                raise
            return [self._sibling(None, exc) for _ in range(n)]
        except Exception as exc:
            if not is_infra_error(exc):
                raise
            return [self._sibling(None, exc) for _ in range(n)]
        children = [self._sibling(child_id, None) for child_id in result]
        children += [self._sibling(None, err) for err in result.errors]
        missing = n - len(children)
        if missing > 0:
            short = SandboxError(500, f"fork asked for {n} children, server answered {len(children)}")
            children += [self._sibling(None, short) for _ in range(missing)]
        return children

    async def exec(self, command: str, **kwargs: Any) -> ExecResult:
        """Runs a command outside the episode (setup, scoring); may raise."""
        if self.sandbox_id is None:
            raise RuntimeError("exec() before reset()")
        kwargs.setdefault("cwd", self.cwd)
        return await self.client.exec_command(self.sandbox_id, command, **kwargs)

    async def run_code(self, code: str, **kwargs: Any) -> "Execution":
        """Runs code in the sandbox's code interpreter (a sandbox of the
        code-interpreter template), keeping its state, as
        AsyncClient.run_code does (same arguments, same Execution);
        outside the episode, and may raise."""
        if self.sandbox_id is None:
            raise RuntimeError("run_code() before reset()")
        return await self.client.run_code(self.sandbox_id, code, **kwargs)

    async def write_file(self, path: str, content: Union[str, bytes]) -> None:
        if self.sandbox_id is None:
            raise RuntimeError("write_file() before reset()")
        await self.client.write_file(self.sandbox_id, path, content)

    async def snapshot(self, name: Optional[str] = None) -> str:
        """Captures the current state; reset() of envs with snapshot=<id> start there."""
        if self.sandbox_id is None:
            raise RuntimeError("snapshot() before reset()")
        return await self.client.create_snapshot(self.sandbox_id, name)

    async def close(self) -> None:
        """Deletes the sandbox (if any). Errors other than caller mistakes are ignored."""
        sandbox_id, self.sandbox_id = self.sandbox_id, None
        if sandbox_id is None:
            return
        try:
            await self.client.delete_sandbox(sandbox_id)
        except Exception as exc:
            if not is_infra_error(exc):
                raise
