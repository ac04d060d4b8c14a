// Package dashboard is the job manager's web dashboard: static files
// (HTML, CSS, JavaScript; no build step, no dependencies) embedded in the
// binary and served at / of the job manager's --http. The page reads the
// REST API (GET /jobs/overview, /jobs/{id}, /jobs/{id}/checkpoints,
// /jobs/{id}/exceptions, /taskmanagers) from the browser and refreshes
// itself; its cancel button sends PATCH /jobs/{id}?mode=cancel with a JSON
// body (never a "simple" cross-site request).
//
// It owns only the files and their handler. It must not compute anything
// a REST client could not: every number it shows comes from the REST API,
// so the dashboard and `curl` never disagree. The files hold no data, so
// they are served without the job manager's token; the API calls they make
// carry it (the page asks for it once when the API answers 401, and says
// why when the token is refused, without asking again by itself).
package dashboard

import (
	"embed"
	"io/fs"
	"net/http"
)

//go:embed static
var files embed.FS

// Handler serves the dashboard: GET / is the page, /static/... its files.
func Handler() http.Handler {
	sub, err := fs.Sub(files, "static")
	if err != nil {
		panic(err) // the embedded tree always has static/
	}
	static := http.StripPrefix("/static/", http.FileServerFS(sub))
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-cache")
		http.ServeFileFS(w, r, sub, "index.html")
	})
	mux.Handle("GET /static/", static)
	return mux
}
