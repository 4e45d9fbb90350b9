package sdk

import (
	"context"
	"strings"
	"sync"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/store/meta"
)

// A jobFeed follows one job's gangs and workers tables for every handle of this process
// on that job's gangs: two watches per job, as a Kubernetes shared informer serves every
// controller of a process from one watch per resource. Each handle had two watches of its
// own: a driver with 15,000 task workers held 30,000 long polls on the leader, each asked
// again every 10 s. The feed keeps the newest record and workers of each gang of the job
// it has seen, so that a handle made after a change still starts from it.
type jobFeed struct {
	c    *conn
	job  string
	stop context.CancelFunc

	mu      sync.Mutex
	handles map[string]map[*Gang]bool           // by gang name
	recs    map[string]meta.KeyValue            // the newest record, by gang name
	workers map[string]map[string]meta.KeyValue // the newest workers, by gang name and key
}

// attach makes g follow its gang's record and workers until detach.
func (c *conn) attach(g *Gang) {
	c.mu.Lock()
	f := c.feeds[g.job]
	if f == nil {
		ctx, stop := context.WithCancel(c.life)
		f = &jobFeed{c: c, job: g.job, stop: stop, handles: map[string]map[*Gang]bool{}, recs: map[string]meta.KeyValue{},
			workers: map[string]map[string]meta.KeyValue{}}
		c.feeds[g.job] = f
		go f.follow(ctx, api.TableGangs+g.job+"/")
		go f.follow(ctx, api.TableWorkers+g.job+"/")
	}
	f.mu.Lock()
	hs := f.handles[g.name]
	if hs == nil {
		hs = map[*Gang]bool{}
		f.handles[g.name] = hs
	}
	hs[g] = true
	rec, ok := f.recs[g.name]
	ws := make([]meta.KeyValue, 0, len(f.workers[g.name]))
	for _, kv := range f.workers[g.name] {
		ws = append(ws, kv)
	}
	f.mu.Unlock()
	c.mu.Unlock()
	// What the feed saw before g joined; what it sees from now on reaches g too, and g
	// keeps the newest of both (by revision).
	if ok {
		g.setRecord(rec)
	}
	for _, kv := range ws {
		g.setWorker(kv)
	}
}

// detach ends g's following; the job's last handle ends the feed.
func (c *conn) detach(g *Gang) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f := c.feeds[g.job]
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if hs := f.handles[g.name]; hs != nil {
		delete(hs, g)
		if len(hs) == 0 {
			delete(f.handles, g.name)
		}
	}
	if len(f.handles) == 0 {
		delete(c.feeds, g.job)
		f.stop()
	}
}

// follow watches prefix (the job's gangs or workers) until ctx ends, keeping the newest
// of each key and handing it to the handles of its gang.
func (f *jobFeed) follow(ctx context.Context, prefix string) {
	workers := strings.HasPrefix(prefix, api.TableWorkers)
	for ctx.Err() == nil {
		_ = f.c.client.Watch(ctx, prefix, func(reset bool, l api.Listing, evs []meta.Event) error {
			kvs := l.KVs
			var gone []string
			for _, ev := range evs {
				if ev.Type == meta.EventPut {
					kvs = append(kvs, ev.KV)
				} else {
					gone = append(gone, ev.KV.Key)
				}
			}
			f.deliver(prefix, workers, reset, kvs, gone)
			return nil
		})
	}
}

// deliver records the keys put and deleted (a reset: the listing of every key) and hands
// each put to its gang's handles.
func (f *jobFeed) deliver(prefix string, workers, reset bool, kvs []meta.KeyValue, gone []string) {
	type put struct {
		kv meta.KeyValue
		hs []*Gang
	}
	puts := make([]put, 0, len(kvs))
	f.mu.Lock()
	if reset && workers {
		f.workers = map[string]map[string]meta.KeyValue{}
	} else if reset {
		f.recs = map[string]meta.KeyValue{}
	}
	for _, key := range gone {
		name, _, _ := strings.Cut(strings.TrimPrefix(key, prefix), "/")
		if workers {
			delete(f.workers[name], key)
			if len(f.workers[name]) == 0 {
				delete(f.workers, name)
			}
		} else if f.recs[name].Key == key {
			delete(f.recs, name)
		}
	}
	for _, kv := range kvs {
		name, _, _ := strings.Cut(strings.TrimPrefix(kv.Key, prefix), "/")
		if workers {
			m := f.workers[name]
			if m == nil {
				m = map[string]meta.KeyValue{}
				f.workers[name] = m
			}
			if kv.ModRevision >= m[kv.Key].ModRevision {
				m[kv.Key] = kv
			}
		} else if kv.ModRevision >= f.recs[name].ModRevision {
			f.recs[name] = kv
		}
		p := put{kv: kv}
		for g := range f.handles[name] {
			p.hs = append(p.hs, g)
		}
		if len(p.hs) > 0 {
			puts = append(puts, p)
		}
	}
	f.mu.Unlock()
	for _, p := range puts {
		for _, g := range p.hs {
			if workers {
				g.setWorker(p.kv)
			} else {
				g.setRecord(p.kv)
			}
		}
	}
}
