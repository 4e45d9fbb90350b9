package runtime

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
)

func TestObjectsPutGetPullFree(t *testing.T) {
	ctx := context.Background()
	l, err := StartLocal(ctx, Config{Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Shutdown(ctx)
	data := []byte("hello, objects")
	id, err := l.PutObject(ctx, 0, "driver", data)
	if err != nil {
		t.Fatal(err)
	}
	v, release, err := l.GetObject(ctx, 2, id) // pulled from machine 0 over the transfer plane
	if err != nil || string(v) != string(data) {
		t.Fatalf("remote get: %q, %v", v, err)
	}
	release()
	oid, _ := parseObjectID(id)
	if !l.Agents[2].Node.Store.Contains(oid) {
		t.Fatal("the pulled copy is not in machine 2's store")
	}
	rec, ok, err := l.meta.Get(ctx, TableObjects, string(id))
	if err != nil || !ok {
		t.Fatalf("object metadata not committed: %v %v", ok, err)
	}
	t.Logf("metadata: %s", rec)
	if err := l.FreeObject(ctx, id); err != nil {
		t.Fatal(err)
	}
	t.Logf("right after free: m0 %v m2 %v", l.Agents[0].Node.Store.Contains(oid), l.Agents[2].Node.Store.Contains(oid))
	deadline := time.Now().Add(2 * time.Second)
	for (l.Agents[0].Node.Store.Contains(oid) || l.Agents[2].Node.Store.Contains(oid)) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if l.Agents[0].Node.Store.Contains(oid) || l.Agents[2].Node.Store.Contains(oid) {
		t.Fatalf("after free: machine 0 holds %v, machine 2 holds %v", l.Agents[0].Node.Store.Contains(oid), l.Agents[2].Node.Store.Contains(oid))
	}
	// The last copy's store forgets its location once nothing pins the bytes (a transfer
	// server may hold them a moment after serving).
	for time.Now().Before(deadline) {
		if _, ok, _ := l.meta.Get(ctx, TableObjects, string(id)); !ok {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, ok, _ := l.meta.Get(ctx, TableObjects, string(id)); ok {
		t.Fatal("metadata outlived the object")
	}
	if _, _, err := l.GetObject(ctx, 1, id); !errors.Is(err, ErrUnknownObject) {
		t.Fatalf("get after free: %v", err)
	}
}
