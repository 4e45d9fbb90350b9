package head

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestCallAgentSendsTheTokenAndBody: the head calls an agent's API as the cluster (its
// token; its certificate under TLS) and reports the agent's refusal with its message.
func TestCallAgentSendsTheTokenAndBody(t *testing.T) {
	got := make(chan map[string]string, 1)
	agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+string(testToken) {
			http.Error(w, "who are you", http.StatusUnauthorized)
			return
		}
		var body map[string]string
		_ = json.NewDecoder(r.Body).Decode(&body)
		body["path"] = r.URL.Path
		got <- body
		if body["id"] == "bad" {
			http.Error(w, "no such object", http.StatusNotFound)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer agent.Close()
	heads, _ := group(t)
	h := heads[0]
	ctx := context.Background()
	if err := h.CallAgent(ctx, agent.URL, "/v1/objects/replicate", map[string]string{"id": "obj", "holder": "ckpt/j/g"}); err != nil {
		t.Fatal(err)
	}
	if b := <-got; b["path"] != "/v1/objects/replicate" || b["id"] != "obj" || b["holder"] != "ckpt/j/g" {
		t.Fatalf("the agent got %v", b)
	}
	err := h.CallAgent(ctx, agent.URL, "/v1/objects/replicate", map[string]string{"id": "bad"})
	<-got
	if err == nil || !strings.Contains(err.Error(), "no such object") {
		t.Fatalf("a refusal: %v, want the agent's message", err)
	}
}
