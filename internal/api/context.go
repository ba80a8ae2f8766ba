package api

import "context"

func contextWithTarget(ctx context.Context, hostport string) context.Context {
	return context.WithValue(ctx, targetKey{}, hostport)
}
