package transfer

import "github.com/prometheus/client_golang/prometheus"

// Error reasons counted in atoll_transfer_errors_total{reason}.
const (
	reasonBadKey       = "bad_key"
	reasonCorrupt      = "corrupt_chunk"
	reasonBadFrame     = "bad_frame"
	reasonAuth         = "auth_failed"
	reasonSourceFailed = "source_failed"
	reasonLost         = "object_lost"
	reasonNotFound     = "not_found"
	reasonRange        = "range"
	reasonTLS          = "tls_failed"
)

// Metrics are the transfer plane's counters. Build with NewMetrics on an injected
// registry; share one between a node's Server and Client.
type Metrics struct {
	ChunksServed prometheus.Counter
	// ChunksSendfile counts served chunks sent with sendfile from the object's
	// shared-memory file (the rest went from the mapping with writev).
	ChunksSendfile prometheus.Counter
	BytesServed    prometheus.Counter
	ChunksPulled   prometheus.Counter
	BytesPulled    prometheus.Counter
	ChunkRefetch   prometheus.Counter
	Pulls          prometheus.Counter
	// PullWaits counts pulls that waited for a pull of the same object into the
	// same store already in progress, instead of copying it a second time.
	PullWaits prometheus.Counter
	// ConnsDialed counts connections dialed and authenticated; ConnsReused the
	// pooled ones a pull took instead; ConnsEvicted pooled ones closed because
	// they broke or idled past ClientConfig.IdleTimeout.
	ConnsDialed  prometheus.Counter
	ConnsReused  prometheus.Counter
	ConnsEvicted prometheus.Counter
	Errors       *prometheus.CounterVec
}

// NewMetrics creates the counters and registers them on reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "atoll", Subsystem: "transfer", Name: name, Help: help})
	}
	m := &Metrics{
		ChunksServed:   c("chunks_served_total", "Chunks sent to pullers."),
		ChunksSendfile: c("chunks_sendfile_total", "Chunks sent with sendfile from the shared-memory file."),
		BytesServed:    c("served_bytes_total", "Bytes sent to pullers."),
		ChunksPulled:   c("chunks_pulled_total", "Chunks received and verified."),
		BytesPulled:    c("pulled_bytes_total", "Bytes received and verified."),
		ChunkRefetch:   c("chunk_refetch_total", "Chunks fetched again after a fingerprint mismatch."),
		Pulls:          c("pulls_total", "Completed pulls."),
		PullWaits:      c("pull_waits_total", "Pulls that waited for the same object's pull into the same store in progress."),
		ConnsDialed:    c("conns_dialed_total", "Connections dialed and authenticated."),
		ConnsReused:    c("conns_reused_total", "Pooled connections reused by a pull."),
		ConnsEvicted:   c("conns_evicted_total", "Pooled connections closed because they broke or idled too long."),
		Errors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "atoll", Subsystem: "transfer",
			Name: "errors_total", Help: "Errors by reason."}, []string{"reason"}),
	}
	if reg != nil {
		for _, col := range []prometheus.Collector{m.ChunksServed, m.ChunksSendfile, m.BytesServed, m.ChunksPulled, m.BytesPulled, m.ChunkRefetch, m.Pulls, m.PullWaits, m.ConnsDialed, m.ConnsReused, m.ConnsEvicted, m.Errors} {
			if err := reg.Register(col); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

func (m *Metrics) err(reason string) { m.Errors.WithLabelValues(reason).Inc() }
