package consumer

import (
	"encoding/json"
	"net/http"
	"path"
)

// HealthHandler returns an http.Handler for the probes of an orchestrator
// (Kubernetes livenessProbe and readinessProbe, a load balancer's health
// check), to mount wherever the program serves HTTP, for example:
//
//	mux.Handle("/health/", http.StripPrefix("/health", consumer.HealthHandler(r)))
//
// It answers GET and HEAD by the last element of the request's path:
//
//   - "livez": 200 "ok" whenever the process answers. Liveness deliberately
//     ignores the broker and the store: a restart cures neither outage,
//     and restarting every worker while the database is down only adds
//     rebalances and cold caches.
//   - "readyz" (or "healthz"): r.Health() as JSON, with status 200 when
//     Health.Ready and 503 otherwise (before Run, while draining, and while
//     a dependency has failed Config.OutageThreshold times in a row).
//
// Other paths get 404, other methods 405. It is safe for concurrent use.
func HealthHandler(r *Runner) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodGet && req.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		switch path.Base(req.URL.Path) {
		case "livez":
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			_, _ = w.Write([]byte("ok\n"))
		case "readyz", "healthz":
			h := r.Health()
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Cache-Control", "no-store")
			if !h.Ready {
				w.WriteHeader(http.StatusServiceUnavailable)
			}
			_ = json.NewEncoder(w).Encode(h)
		default:
			http.NotFound(w, req)
		}
	})
}
