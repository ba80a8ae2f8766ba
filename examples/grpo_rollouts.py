#!/usr/bin/env python3
"""GRPO-style group rollouts on aenv: the seed's GRPOTrainer flow, runnable
as is against a local server, with no GPU, no model and no network.

    AENV_URL=http://127.0.0.1:8000 AENV_API_KEY=... python3 examples/grpo_rollouts.py

Flow, per iteration:
  1. set up a coding task once: a small buggy Python project and its test
     script written into a sandbox (SandboxEnv.reset + files);
  2. snapshot it (when the server supports snapshots);
  3. fork G children from it (SandboxEnv.fork), one per group member;
  4. roll out a policy in each child concurrently: actions are shell
     commands, rewards the seed's (_compute_reward);
  5. print each trajectory's return, the group-normalised advantages
     (A_i = (R_i - mean) / std over the group) and the success rate,
     masking trajectories that hit an infrastructure failure instead of
     scoring them zero;
  6. delete the children, then at the end the base sandbox and snapshot.

On a server without fork (or snapshots) yet, each child is instead
created from the template and the setup replayed: slower, same results.

The policy is pluggable: --policy module:factory names a function that
returns an async callable policy(observation, history, rng) -> command.
The default samples from a list of candidate shell commands. An LLM
policy builds a prompt from the observation, as the seed's
_policy_generate does, and returns the model's last line, e.g.:

    def make_policy():
        async def policy(observation, history, rng):
            prompt = f"Current codebase state:\\n{observation}\\n\\nNext shell command:"
            return (await my_llm.generate(prompt)).strip().splitlines()[-1]
        return policy
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import math
import os
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Dict, List, Optional

try:
    import aenv
except ImportError:  # running from a checkout without `pip install ./sdk/python`
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sdk", "python", "src"))
    import aenv

WORKDIR = "/workspace"


@dataclass
class CodingTask:
    """The seed's CodingTask, with the project inlined instead of cloned."""

    description: str
    files: Dict[str, str]
    test_command: str
    setup_commands: List[str] = field(default_factory=list)


BUGGY_CALC = '''\
def add(a, b):
    return a - b


def mean(xs):
    return sum(xs) / len(xs)
'''

TEST_CALC = '''\
import sys
sys.path.insert(0, ".")
import calc

failures = 0
for args, want in [((2, 3), 5), ((-1, 1), 0), ((0, 0), 0)]:
    got = calc.add(*args)
    if got != want:
        print(f"ERROR: add{args} = {got}, want {want}", file=sys.stderr)
        failures += 1
if calc.mean([1, 2, 3]) != 2:
    print("ERROR: mean is wrong", file=sys.stderr)
    failures += 1
if failures:
    sys.exit(1)
print("ALL TESTS PASSED")
'''

TASK = CodingTask(
    description="Fix the addition bug in calc.py",
    files={f"{WORKDIR}/calc.py": BUGGY_CALC, f"{WORKDIR}/test_calc.py": TEST_CALC},
    test_command="python3 test_calc.py",
    setup_commands=[
        "git init -q . && git add -A && git -c user.email=a@b -c user.name=aenv commit -qm init",
        "touch /tmp/start",
    ],
)

# The seed's _get_env_state, run after every step as the observation.
OBSERVE = ("echo '=== FILES ===' && find . -name '*.py' -newer /tmp/start | head -20 && "
           "echo '=== GIT DIFF ===' && git diff --stat 2>/dev/null || true")

CANDIDATES = [
    "cat calc.py",
    "python3 test_calc.py",
    "sed -i 's/return a - b/return a + b/' calc.py",
    "sed -i 's/return a - b/return a + b/' calc.py && python3 test_calc.py",
    "sed -i 's/return a - b/return a * b/' calc.py && python3 test_calc.py",
    "sed -i 's/return a - b/return b - a/' calc.py",
    "git checkout -- calc.py",
    "ls -la",
    "grep -n return calc.py",
]

Policy = Callable[[str, List[Dict[str, Any]], random.Random], Awaitable[str]]


def make_random_policy() -> Policy:
    """Samples a candidate command uniformly: a stand-in for an LLM."""
    async def policy(observation: str, history: List[Dict[str, Any]], rng: random.Random) -> str:
        return rng.choice(CANDIDATES)
    return policy


def compute_reward(action: str, result: Dict[str, Any], env: aenv.SandboxEnv) -> float:
    """The seed's _compute_reward."""
    reward = 0.0
    if result["exitCode"] == 0:
        reward += 1.0  # command executed successfully
    if "ALL TESTS PASSED" in result.get("stdout", ""):
        reward += 5.0  # tests passed
    if "ERROR" in result.get("stderr", ""):
        reward -= 0.5  # error occurred
    return reward


def tests_passed(action: str, result: Dict[str, Any], env: aenv.SandboxEnv) -> bool:
    return result["exitCode"] == 0 and "ALL TESTS PASSED" in result.get("stdout", "")


class Timings:
    """Wall time of sandbox operations versus time spent in commands.
    reset is create (+ task setup when not from a snapshot); command is
    each policy action's execute round trip."""

    def __init__(self):
        self.ops: Dict[str, List[float]] = {}

    def add(self, name: str, seconds: float) -> None:
        self.ops.setdefault(name, []).append(seconds)

    def report(self) -> str:
        lines = []
        for name, xs in sorted(self.ops.items()):
            lines.append(f"  {name:<8} n={len(xs):<4} total={sum(xs):7.2f}s  mean={1000 * sum(xs) / len(xs):8.1f}ms")
        return "\n".join(lines)


async def timed(timings: Timings, name: str, coro: Awaitable[Any]) -> Any:
    start = time.monotonic()
    try:
        return await coro
    finally:
        timings.add(name, time.monotonic() - start)


async def set_up_task(env: aenv.SandboxEnv, task: CodingTask) -> None:
    """The seed's setup_environment, with files written instead of cloned."""
    await env.exec(f"mkdir -p {WORKDIR}", cwd="/")
    for path, content in task.files.items():
        await env.write_file(path, content)
    for cmd in task.setup_commands:
        result = await env.exec(cmd)
        if result["exitCode"] != 0:
            raise RuntimeError(f"setup failed: {cmd}: {result['stderr']}")


async def rollout(env: aenv.SandboxEnv, observation: Any, policy: Policy, rng: random.Random,
                  timings: Timings) -> Dict[str, Any]:
    """The seed's _rollout_single over a SandboxEnv."""
    traj: Dict[str, Any] = {"sandbox_id": env.sandbox_id, "steps": [], "return": 0.0,
                            "success": False, "infra_error": env.infra_error is not None}
    if env.infra_error is not None:
        traj["error"] = str(env.infra_error)
        return traj
    done = False
    while not done:
        action = await policy(observation or "", traj["steps"], rng)
        observation, reward, done, info = await env.step(action)
        if info["infra_error"]:
            traj["infra_error"], traj["error"] = True, info["error"]
            break
        timings.add("command", info["exec_seconds"])
        traj["steps"].append({"action": action, "reward": reward, "exit_code": info["exit_code"]})
        traj["return"] += reward
        if done and not info["truncated"]:
            traj["success"] = True
            traj["return"] += 10.0  # the seed's final_reward on success
    return traj


def advantages(returns: List[Optional[float]]) -> List[Optional[float]]:
    """Group-normalised advantages over the valid (non-None) returns."""
    valid = [r for r in returns if r is not None]
    if not valid:
        return [None] * len(returns)
    mean = sum(valid) / len(valid)
    std = math.sqrt(sum((r - mean) ** 2 for r in valid) / len(valid))
    return [None if r is None else (r - mean) / (std + 1e-8) for r in returns]


class Runner:
    def __init__(self, client: aenv.AsyncClient, args: argparse.Namespace, policy: Policy):
        self.client = client
        self.args = args
        self.policy = policy
        self.timings = Timings()
        self.fork_supported = not args.no_fork
        self.snapshot_id: Optional[str] = None

    def new_env(self, snapshot: Optional[str] = None) -> aenv.SandboxEnv:
        # From a snapshot the task is already set up; from the template it is not.
        setup = None if snapshot else (lambda env: set_up_task(env, TASK))
        create_kwargs = {"timeout_s": 600, "metadata": {"example": "grpo_rollouts"}}
        if self.args.dataset_volume and not snapshot:
            # Read-only for every rollout; a snapshot (and its forks) keeps
            # the mounts its sandbox had, so it is given none.
            create_kwargs["volume_mounts"] = {"/data": {"name": self.args.dataset_volume, "read_only": True}}
        return aenv.SandboxEnv(self.client, self.args.template, snapshot=snapshot, setup=setup,
                               reward_fn=compute_reward, done_fn=tests_passed, observe=OBSERVE,
                               max_steps=self.args.max_steps, step_timeout=60, cwd=WORKDIR,
                               create_kwargs=create_kwargs)

    async def make_group(self, base: aenv.SandboxEnv) -> List[aenv.SandboxEnv]:
        """G envs in the base's state: forked, or else created and set up."""
        g = self.args.group_size
        if self.fork_supported:
            try:
                start = time.monotonic()
                envs = await base.fork(g)
                self.timings.add("fork", time.monotonic() - start)
                return envs
            except aenv.SandboxError as exc:
                if exc.status not in (404, 405, 501):
                    raise
                print(f"  fork unsupported by this server ({exc}); creating children instead")
                self.fork_supported = False
        envs = [self.new_env(self.snapshot_id) for _ in range(g)]
        await asyncio.gather(*(timed(self.timings, "reset", env.reset()) for env in envs))
        return envs

    async def snapshot(self, base: aenv.SandboxEnv) -> None:
        if self.args.no_snapshot:
            return
        try:
            start = time.monotonic()
            self.snapshot_id = await base.snapshot()
            self.timings.add("snapshot", time.monotonic() - start)
            print(f"  snapshot {self.snapshot_id}")
        except aenv.SandboxError as exc:
            if exc.status not in (404, 405, 501):
                raise
            print(f"  snapshots unsupported by this server ({exc}); continuing without")

    async def run_group(self, base: aenv.SandboxEnv, iteration: int) -> Dict[str, Any]:
        envs = await self.make_group(base)
        try:
            # A forked child's observation is the base's: observe it afresh.
            observations = await asyncio.gather(*(self.observe(env) for env in envs))
            rngs = [random.Random(self.args.seed * 1000 + iteration * 100 + i) for i in range(len(envs))]
            trajs = await asyncio.gather(*(rollout(env, obs, self.policy, rng, self.timings)
                                           for env, obs, rng in zip(envs, observations, rngs)))
        finally:
            await asyncio.gather(*(timed(self.timings, "delete", env.close()) for env in envs))
        return summarize(iteration, trajs)

    async def observe(self, env: aenv.SandboxEnv) -> Any:
        if env.infra_error is not None:
            return None
        try:
            return (await env.exec(OBSERVE))["stdout"]
        except aenv.AenvError as exc:
            if not aenv.is_infra_error(exc):
                raise
            env.infra_error, env.done = exc, True
            return None

    async def run(self) -> List[Dict[str, Any]]:
        base = self.new_env()
        summaries = []
        try:
            print(f"Task: {TASK.description} (template {self.args.template!r})")
            await timed(self.timings, "reset", base.reset())
            if base.infra_error is not None:
                raise RuntimeError(f"could not create the base sandbox: {base.infra_error}")
            print(f"  base sandbox {base.sandbox_id} ready")
            await self.snapshot(base)
            for it in range(self.args.iterations):
                print(f"\n=== Iteration {it + 1}/{self.args.iterations}: group of {self.args.group_size} ===")
                summaries.append(await self.run_group(base, it))
        finally:
            await timed(self.timings, "delete", base.close())
            if self.snapshot_id:
                try:
                    await self.client.delete_snapshot(self.snapshot_id)
                except aenv.AenvError as exc:
                    print(f"  could not delete snapshot {self.snapshot_id}: {exc}")
        return summaries


def summarize(iteration: int, trajs: List[Dict[str, Any]]) -> Dict[str, Any]:
    returns = [None if t["infra_error"] else t["return"] for t in trajs]
    advs = advantages(returns)
    for i, (t, a) in enumerate(zip(trajs, advs)):
        if t["infra_error"]:
            print(f"  [{i}] MASKED (infrastructure failure: {t.get('error')})")
            continue
        print(f"  [{i}] return={t['return']:6.2f} advantage={a:+.3f} steps={len(t['steps'])} "
              f"success={t['success']}")
    valid = [t for t in trajs if not t["infra_error"]]
    rate = sum(t["success"] for t in valid) / len(valid) if valid else 0.0
    print(f"  success rate {rate:.0%} over {len(valid)} valid of {len(trajs)} trajectories")
    return {"iteration": iteration, "returns": returns, "advantages": advs, "success_rate": rate,
            "masked": len(trajs) - len(valid)}


def load_policy(spec: Optional[str]) -> Policy:
    if not spec:
        return make_random_policy()
    module, _, factory = spec.partition(":")
    return getattr(importlib.import_module(module), factory or "make_policy")()


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=os.environ.get("AENV_URL", "http://127.0.0.1:8000"))
    p.add_argument("--api-key", default=os.environ.get("AENV_API_KEY", ""))
    p.add_argument("--template", default="base")
    p.add_argument("--iterations", type=int, default=2)
    p.add_argument("--group-size", type=int, default=8, help="GRPO's G: children forked per group")
    p.add_argument("--max-steps", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--policy", help="module:factory returning an async policy (default: random)")
    p.add_argument("--no-fork", action="store_true", help="create and set up each child instead of forking")
    p.add_argument("--no-snapshot", action="store_true")
    p.add_argument("--dataset-volume", metavar="NAME",
                   help="mount this volume (aenv volume create/cp) read-only at /data in every rollout")
    p.add_argument("--short", action="store_true", help="1 iteration, G=3, 4 steps (for tests)")
    args = p.parse_args(argv)
    if args.short:
        args.iterations, args.group_size, args.max_steps = 1, 3, 4
    return args


async def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    start = time.monotonic()
    async with aenv.AsyncClient(args.url, args.api_key, max_connections=64) as client:
        runner = Runner(client, args, load_policy(args.policy))
        summaries = await runner.run()
    wall = time.monotonic() - start
    rates = [s["success_rate"] for s in summaries]
    print(f"\nMean success rate {sum(rates) / len(rates):.0%} over {len(rates)} groups; "
          f"masked trajectories: {sum(s['masked'] for s in summaries)}")
    print(f"Timings (wall {wall:.2f}s; sandbox operations vs commands):")
    print(runner.timings.report())
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
