// Command fakeenvd stands in for envd in the runtime conformance test. It is
// built static and run as a sandbox's init. It serves, on port 49983:
//
//	GET  /state             {"nonce","counter","cpus","hostname"} as JSON
//	GET  /file?path=P       the content of file P (404 if absent)
//	POST /file?path=P&data=D write D to file P
//	POST /exit              exit with status 3 (the init dies)
//	POST /alloc?mb=N        fill N MiB of memory with data derived from the nonce
//	GET  /alloc             SHA-256 of that memory, recomputed now
//
// The nonce is random per process start and the counter grows every 10 ms
// in memory, so a restored copy shows whether its memory came from the
// checkpoint and whether time inside it stood still while paused.
package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	goruntime "runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// stateReply is what GET /state returns.
type stateReply struct {
	Nonce    string `json:"nonce"`
	Counter  int64  `json:"counter"`
	CPUs     int    `json:"cpus"`
	Hostname string `json:"hostname"`
}

func main() {
	if err := run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "fakeenvd:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	nonceBytes := make([]byte, 8)
	if _, err := rand.Read(nonceBytes); err != nil {
		return err
	}
	nonce := hex.EncodeToString(nonceBytes)
	var counter atomic.Int64
	go func() {
		for range time.Tick(10 * time.Millisecond) {
			counter.Add(1)
		}
	}()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /state", func(w http.ResponseWriter, r *http.Request) {
		host, _ := os.Hostname()
		reply := stateReply{Nonce: nonce, Counter: counter.Load(), CPUs: goruntime.NumCPU(), Hostname: host}
		_ = json.NewEncoder(w).Encode(reply)
	})
	mux.HandleFunc("GET /file", func(w http.ResponseWriter, r *http.Request) {
		b, err := os.ReadFile(r.URL.Query().Get("path"))
		if errors.Is(err, fs.ErrNotExist) {
			http.Error(w, "no such file", http.StatusNotFound)
			return
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_, _ = w.Write(b)
	})
	mux.HandleFunc("POST /file", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if err := os.WriteFile(q.Get("path"), []byte(q.Get("data")), 0o644); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})
	var ballast []byte
	var ballastMu sync.Mutex
	mux.HandleFunc("POST /alloc", func(w http.ResponseWriter, r *http.Request) {
		mb, err := strconv.Atoi(r.URL.Query().Get("mb"))
		if err != nil || mb <= 0 {
			http.Error(w, "bad mb", http.StatusBadRequest)
			return
		}
		ballastMu.Lock()
		defer ballastMu.Unlock()
		ballast = make([]byte, mb<<20)
		// Distinct, incompressible-looking content on every page, so that
		// a checkpoint must really carry it.
		seed := sha256.Sum256([]byte(nonce))
		for i := 0; i < len(ballast); i += len(seed) {
			seed = sha256.Sum256(seed[:])
			copy(ballast[i:], seed[:])
		}
		fmt.Fprintf(w, "%x", sha256.Sum256(ballast))
	})
	mux.HandleFunc("GET /alloc", func(w http.ResponseWriter, r *http.Request) {
		ballastMu.Lock()
		defer ballastMu.Unlock()
		fmt.Fprintf(w, "%x", sha256.Sum256(ballast))
	})
	mux.HandleFunc("POST /exit", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
		go func() {
			time.Sleep(50 * time.Millisecond)
			os.Exit(3)
		}()
	})
	fmt.Println("fakeenvd listening on :49983")
	srv := &http.Server{Addr: ":49983", Handler: mux, BaseContext: func(_ net.Listener) context.Context { return ctx }}
	return srv.ListenAndServe()
}
