package network

import (
	"context"
	"errors"
	"time"
)

// fillRetryDelay spaces out attempts after a slot creation failed, so a broken host
// does not turn the filler into a busy loop.
const fillRetryDelay = time.Second

// startFiller runs the goroutine that keeps cfg.WarmPool slots ready.
func (p *Pool) startFiller(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	stopped := make(chan struct{})
	p.mu.Lock()
	p.stop, p.stopped = cancel, stopped
	p.mu.Unlock()
	go func() {
		defer close(stopped)
		p.runFiller(ctx)
	}()
	p.wakeFiller()
}

// wakeFiller asks the filler to top up the warm pool; it never blocks.
func (p *Pool) wakeFiller() {
	select {
	case p.fill <- struct{}{}:
	default:
	}
}

func (p *Pool) runFiller(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.fill:
		}
		for ctx.Err() == nil {
			err := p.fillOne()
			if errors.Is(err, errWarmPoolFull) || errors.Is(err, ErrExhausted) {
				// Nothing to do until an Acquire or Release changes that.
				break
			}
			if err != nil {
				p.logger.WarnContext(ctx, "fill warm pool", "err", err)
				select {
				case <-ctx.Done():
				case <-time.After(fillRetryDelay):
				}
			}
		}
	}
}

var errWarmPoolFull = errors.New("warm pool full")

// fillOne creates one warm slot if the warm pool, counting slots being created for
// it, is short.
func (p *Pool) fillOne() error {
	p.mu.Lock()
	if p.closed || p.warm+p.filling >= p.cfg.WarmPool {
		p.mu.Unlock()
		return errWarmPoolFull
	}
	i, err := p.reserveLocked()
	if err != nil {
		p.mu.Unlock()
		return err
	}
	p.filling++
	p.mu.Unlock()
	defer p.inflight.Done()

	createErr := createSlot(p.cfg.slot(i))
	p.mu.Lock()
	defer p.mu.Unlock()
	p.filling--
	if createErr != nil {
		delete(p.state, i)
		return createErr
	}
	p.state[i] = stateWarm
	p.warm++
	return nil
}
