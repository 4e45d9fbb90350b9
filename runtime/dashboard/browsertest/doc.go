// Package browsertest opens the dashboard of an embedded cluster in headless Chromium
// (chromedp) and checks what a person sees. It is its own Go module so that chromedp never
// enters the root module's dependency graph, nor a user's:
//
//	go -C runtime/dashboard/browsertest test ./...
package browsertest
