// Package dashboard is Atoll's web dashboard: the pages (embedded in the binary with
// go:embed, charts drawn by the vendored Chart.js), the state they show, computed from what
// a head knows (Build), the ring of samples behind the plots (Series), and the HTTP
// handler that serves them under /ui/.
//
// The pages hold nothing of the cluster: every figure comes from the read endpoints under
// /ui/api/, which need the dashboard token (api.DashboardToken, derived from the cluster
// secret) as a bearer token. `atoll status` prints the dashboard's URL with the token in
// it, as Jupyter does; the page moves it from the address bar to the tab's session
// storage. The token opens these read endpoints and /metrics, never the control API.
//
//	h := dashboard.Handler(dashboard.Config{Token: api.DashboardToken(secret), Source: src})
//	mux.Handle("/ui/", h)
package dashboard
