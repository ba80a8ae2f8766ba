package envd

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"strconv"
	"time"
)

// accessTokenHeader carries the token /init configured.
const accessTokenHeader = "X-Access-Token"

// Signed /files URL failures, worded as upstream envd words them: the SDK
// and its users see these messages.
var (
	errTokenMismatch    = errors.New("access token present in header but does not match")
	errMissingSignature = errors.New("missing signature query parameter")
	errBadSignature     = errors.New("invalid signature")
	errExpiredSignature = errors.New("signature is already expired")
)

// writeJSONError writes the envd error body {"code":<status>,"message":…}.
func writeJSONError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{status, msg})
}

// tokenMatches reports whether got equals the configured token; with no
// token configured everything matches.
func tokenMatches(want, got string) bool {
	if want == "" {
		return true
	}
	return subtle.ConstantTimeCompare([]byte(want), []byte(got)) == 1
}

// requireToken rejects requests without the current access token.
func (s *Server) requireToken(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !tokenMatches(s.settings.token(), r.Header.Get(accessTokenHeader)) {
			writeJSONError(w, http.StatusUnauthorized, "invalid access token")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// fileSignature computes the signature upstream's signed /files URLs carry:
// "v1_" + unpadded std base64 of sha256("path:op:user:token[:expiration]").
func fileSignature(path, operation, username, token, expiration string) string {
	msg := path + ":" + operation + ":" + username + ":" + token
	if expiration != "" {
		msg += ":" + expiration
	}
	sum := sha256.Sum256([]byte(msg))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// authorizeFiles checks a /files request: with a token configured it needs
// either the token header or a valid, unexpired signature. The signature is
// checked before its expiry, so a forger learns nothing about the latter.
func (s *Server) authorizeFiles(r *http.Request, operation string) error {
	token := s.settings.token()
	if token == "" {
		return nil
	}
	if got := r.Header.Get(accessTokenHeader); got != "" {
		if tokenMatches(token, got) {
			return nil
		}
		return errTokenMismatch
	}
	q := r.URL.Query()
	sig := q.Get("signature")
	if sig == "" {
		return errMissingSignature
	}
	expiration := q.Get("signature_expiration")
	want := fileSignature(q.Get("path"), operation, q.Get("username"), token, expiration)
	if subtle.ConstantTimeCompare([]byte(want), []byte(sig)) != 1 {
		return errBadSignature
	}
	if expiration != "" {
		exp, err := strconv.ParseInt(expiration, 10, 64)
		if err != nil {
			return errBadSignature
		}
		if exp < time.Now().Unix() {
			return errExpiredSignature
		}
	}
	return nil
}

// handleInit applies POST /init. Open until a token exists; afterwards only
// the holder of the current token may change it (re-keying a fork).
func (s *Server) handleInit(w http.ResponseWriter, r *http.Request) {
	s.initMu.Lock()
	defer s.initMu.Unlock()
	if !tokenMatches(s.settings.token(), r.Header.Get(accessTokenHeader)) {
		writeJSONError(w, http.StatusUnauthorized, "invalid access token")
		return
	}
	var req initRequest
	err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req)
	if err != nil && !errors.Is(err, io.EOF) {
		writeJSONError(w, http.StatusBadRequest, "invalid init body: "+err.Error())
		return
	}
	s.settings.apply(req)
	if req.KillProcesses {
		n := killOtherProcesses()
		s.log.Info("killed every process but envd", "count", n)
		if err := clearDir(sharedMemoryDir); err != nil && !os.IsNotExist(err) {
			s.log.Warn("empty /dev/shm", "err", err)
		}
	}
	if len(req.Nameservers) > 0 {
		if err := writeResolvConf(s.resolvConfPath(), req.Nameservers); err != nil {
			s.log.Warn("write resolv.conf", "err", err)
		}
	}
	s.log.Info("initialized", "defaultUser", s.settings.user(), "envVars", len(req.EnvVars), "tokenSet", req.AccessToken != nil)
	if s.onInit != nil {
		s.onInit(req.Reseed)
	}
	w.WriteHeader(http.StatusNoContent)
}
