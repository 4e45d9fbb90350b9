package head

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
)

// agentClient is the head's HTTP client for agents' APIs: with its certificate when the
// cluster runs mutual TLS.
type agentClient struct {
	once sync.Once
	hc   *http.Client
}

// CallAgent posts body to an agent's API (agentAPI is its URL, as the machine registered
// it) with this head's certificate and the cluster token. The pools use it to copy an
// object's last copy off a machine that is about to go.
func (h *Head) CallAgent(ctx context.Context, agentAPI, path string, body any) error {
	h.agents.once.Do(func() {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		if h.id != nil {
			tr.TLSClientConfig = h.id.Client()
		}
		h.agents.hc = &http.Client{Transport: tr}
	})
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, agentAPI+path, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+string(h.cfg.Token))
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.agents.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("agent %s%s: %s: %s", agentAPI, path, resp.Status, bytes.TrimSpace(msg))
	}
	return nil
}
