package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"
)

// The rollout task: a tiny Python project whose test script scores an
// implementation. Each step of a rollout "edits" calc.py (a candidate the
// policy proposes), runs the tests and reads the score back.
const (
	rolloutDir  = "/home/user/proj"
	rolloutTest = `import json
import calc

cases = [("add", (2, 3), 5), ("add", (-1, 1), 0), ("mul", (3, 4), 12), ("mul", (0, 9), 0)]
passed = 0
for name, args, want in cases:
    try:
        if getattr(calc, name)(*args) == want:
            passed += 1
    except Exception:
        pass
print(f"passed {passed}/{len(cases)}")
with open("result.json", "w") as f:
    json.dump({"passed": passed, "total": len(cases)}, f)
`
)

// candidate is the calc.py a child proposes at a step: one of a few
// implementations, picked by child and step so rewards differ.
func candidate(child, step int) string {
	adds := []string{"a + b", "a - b", "b + a"}
	muls := []string{"a * b", "a + b"}
	k := child*7 + step*3
	return fmt.Sprintf("def add(a, b):\n    return %s\n\n\ndef mul(a, b):\n    return %s\n", adds[k%len(adds)], muls[k%len(muls)])
}

// rolloutTimes adds up where a group's wall time went.
type rolloutTimes struct {
	sandboxOps time.Duration // fork and delete
	commands   time.Duration // the step phase: edits, test runs, reads
	rewards    []float64
}

// runRollout is a GRPO-shaped loop: prepare one sandbox, then per group
// fork G children, run the steps in each at once, collect rewards and
// delete the children.
func (b *bench) runRollout(ctx context.Context) error {
	g, steps := b.cfg.RolloutG, b.cfg.RolloutSteps
	groupFig := b.rec.figure("rollout_group", fmt.Sprintf("Rollout group (fork %d, %d steps each, delete)", g, steps), GroupRollout, UnitMs)
	forkFig := b.rec.figure("rollout_fork", fmt.Sprintf("Rollout: fork of %d", g), GroupRollout, UnitMs)
	stepFig := b.rec.figure("rollout_step", "Rollout step (write file, run tests, read result)", GroupRollout, UnitMs)
	rateFig := b.rec.figure("rollout_groups_per_min", "Rollout groups per minute", GroupRollout, UnitPerMinute)
	opsFig := b.rec.figure("rollout_sandbox_ops_share", "Rollout: share of wall time in fork+delete", GroupRollout, UnitPercent)
	cmdFig := b.rec.figure("rollout_command_share", "Rollout: share of wall time in command steps", GroupRollout, UnitPercent)

	parent, err := b.aenv.boot(ctx)
	if err != nil {
		return fmt.Errorf("prepare: %w", err)
	}
	defer b.aenv.remove(context.WithoutCancel(ctx), parent)
	if err := b.prepareProject(ctx, parent); err != nil {
		return fmt.Errorf("prepare: %w", err)
	}
	var total rolloutTimes
	start := time.Now()
	groups := 0
	for i := 0; i < b.cfg.RolloutGroups && ctx.Err() == nil; i++ {
		groupStart := time.Now()
		t, err := b.rolloutGroup(ctx, parent, stepFig, forkFig)
		if err != nil {
			b.rec.fail(groupFig, SystemAenv, err)
			continue
		}
		b.rec.addDuration(groupFig, SystemAenv, time.Since(groupStart))
		total.sandboxOps += t.sandboxOps
		total.commands += t.commands
		total.rewards = append(total.rewards, t.rewards...)
		groups++
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if groups == 0 {
		return errors.New("no group completed")
	}
	wall := time.Since(start)
	b.rec.add(rateFig, SystemAenv, float64(groups)/wall.Minutes())
	b.rec.add(opsFig, SystemAenv, 100*total.sandboxOps.Seconds()/wall.Seconds())
	b.rec.add(cmdFig, SystemAenv, 100*total.commands.Seconds()/wall.Seconds())
	b.rec.describe(rateFig, fmt.Sprintf("%d groups; mean reward %.2f over %d rollouts", groups, Summarize(total.rewards).Avg, len(total.rewards)))
	return nil
}

// prepareProject writes the project through the files API (nothing from
// the network) and checks its test script runs.
func (b *bench) prepareProject(ctx context.Context, bx *box) error {
	if err := b.c.WriteText(ctx, bx.id, rolloutDir+"/test_calc.py", rolloutTest); err != nil {
		return err
	}
	if err := b.c.WriteText(ctx, bx.id, rolloutDir+"/calc.py", candidate(0, 0)); err != nil {
		return err
	}
	err := execOK(ctx, b.c, bx.id, "cd "+rolloutDir+" && python3 test_calc.py")
	return err
}

// rolloutGroup forks the prepared sandbox, runs every child's steps at
// once and deletes the children.
func (b *bench) rolloutGroup(ctx context.Context, parent *box, stepFig, forkFig *Figure) (t rolloutTimes, err error) {
	forkStart := time.Now()
	children, errs := b.aenv.fork(ctx, parent, b.cfg.RolloutG)
	t.sandboxOps += time.Since(forkStart)
	defer func() {
		delStart := time.Now()
		removeAll(context.WithoutCancel(ctx), b.aenv, children, 8)
		t.sandboxOps += time.Since(delStart)
	}()
	if len(errs) > 0 {
		return t, fmt.Errorf("fork: %w", errors.Join(errs...))
	}
	b.rec.addDuration(forkFig, SystemAenv, time.Since(forkStart))

	stepsStart := time.Now()
	var mu sync.Mutex
	var failed []error
	forEach(ctx, len(children), len(children), func(ctx context.Context, i int) {
		reward, err := b.rolloutChild(ctx, children[i], i, stepFig)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			failed = append(failed, err)
			return
		}
		t.rewards = append(t.rewards, reward)
	})
	t.commands = time.Since(stepsStart)
	if ctx.Err() != nil {
		return t, ctx.Err()
	}
	if len(failed) > 0 {
		return t, fmt.Errorf("%d of %d rollouts failed: %w", len(failed), len(children), failed[0])
	}
	return t, nil
}

// rolloutChild runs the steps in one child and returns its last reward.
func (b *bench) rolloutChild(ctx context.Context, child *box, i int, stepFig *Figure) (float64, error) {
	reward := 0.0
	for step := 0; step < b.cfg.RolloutSteps; step++ {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		stepStart := time.Now()
		if err := b.c.WriteText(ctx, child.id, rolloutDir+"/calc.py", candidate(i, step)); err != nil {
			return 0, err
		}
		if err := execOK(ctx, b.c, child.id, "cd "+rolloutDir+" && python3 test_calc.py"); err != nil {
			return 0, err
		}
		out, err := b.c.ReadText(ctx, child.id, rolloutDir+"/result.json")
		if err != nil {
			return 0, err
		}
		var res struct{ Passed, Total int }
		if err := json.Unmarshal([]byte(out), &res); err != nil || res.Total == 0 {
			return 0, fmt.Errorf("result.json %q: %v", out, err)
		}
		reward = float64(res.Passed) / float64(res.Total)
		b.rec.addDuration(stepFig, SystemAenv, time.Since(stepStart))
	}
	return reward, nil
}
