package object

import "github.com/prometheus/client_golang/prometheus"

// metrics are the store's counters, registered on the registry given in Config
// (never the global one).
type metrics struct {
	puts, gets, frees, spills, restores prometheus.Counter
	bytesPut, bytesSpilled              prometheus.Counter
	persists, bytesPersisted            prometheus.Counter
	shmRetries                          prometheus.Counter
	errors                              *prometheus.CounterVec
}

// Error reasons counted in atoll_object_errors_total{reason}.
const (
	reasonNotFound    = "not_found"
	reasonTooLarge    = "too_large"
	reasonStoreFull   = "store_full"
	reasonDiskFull    = "disk_full"
	reasonLost        = "lost"
	reasonFingerprint = "fingerprint"
	reasonLeaseExpiry = "lease_expired"
	reasonPersist     = "persist_failed"
)

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "atoll", Subsystem: "object", Name: name, Help: help})
	}
	m := &metrics{
		puts:           c("puts_total", "Objects put or created."),
		gets:           c("gets_total", "Successful gets."),
		frees:          c("frees_total", "Objects freed after their last reference."),
		spills:         c("spills_total", "Objects spilled to the cold tier."),
		restores:       c("restores_total", "Objects restored from the cold tier."),
		bytesPut:       c("put_bytes_total", "Bytes put."),
		bytesSpilled:   c("spilled_bytes_total", "Uncompressed bytes spilled."),
		shmRetries:     c("shm_full_retries_total", "Allocations that found shared memory full, made room and tried again."),
		persists:       c("persists_total", "Objects made durable (written and fsync'd to the durable tier)."),
		bytesPersisted: c("persisted_bytes_total", "Bytes written to the durable tier."),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "atoll", Subsystem: "object",
			Name: "errors_total", Help: "Errors by reason."}, []string{"reason"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, col := range []prometheus.Collector{m.puts, m.gets, m.frees, m.spills, m.restores, m.bytesPut, m.bytesSpilled, m.shmRetries, m.persists, m.bytesPersisted, m.errors} {
		if err := reg.Register(col); err != nil {
			return nil, err
		}
	}
	return m, nil
}
