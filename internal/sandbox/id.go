package sandbox

import "crypto/rand"

const idAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

// NewID returns a sandbox or template ID: 20 characters of [a-z0-9], so it
// works as a DNS label (<port>-<id>.<domain>), as upstream E2B's IDs do.
func NewID() string { return randomString(20, idAlphabet) }

// newAccessToken returns an envd access token.
func newAccessToken() string {
	return randomString(40, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
}

func randomString(n int, alphabet string) string {
	// Rejection sampling keeps the distribution uniform.
	limit := 256 - 256%len(alphabet)
	out := make([]byte, 0, n)
	buf := make([]byte, n*2)
	for len(out) < n {
		rand.Read(buf)
		for _, b := range buf {
			if int(b) < limit && len(out) < n {
				out = append(out, alphabet[int(b)%len(alphabet)])
			}
		}
	}
	return string(out)
}
