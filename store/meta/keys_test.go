package meta

import (
	"errors"
	"strings"
	"testing"
)

// TestKeysOutsideEveryTableAreRefused: a write or a guard on a key in no table, or on a
// table's bare prefix, is refused before it is proposed, naming the key.
func TestKeysOutsideEveryTableAreRefused(t *testing.T) {
	for _, r := range []Request{
		{Ops: []Op{{Type: OpPut, Key: "nosuch/x", Value: []byte("v")}}},
		{Ops: []Op{{Type: OpPut, Key: "../jobs/x", Value: []byte("v")}}},
		{Ops: []Op{{Type: OpPut, Key: "jobs/j", Value: []byte("v")}}, Compares: []Compare{{Key: "nosuch/y"}}},
		{Ops: []Op{{Type: OpDelete, Key: "jobs/"}}},
	} {
		err := r.Validate()
		if !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), "key") {
			t.Errorf("%+v: %v, want ErrBadRequest naming the key", r, err)
		}
	}
	ok := Request{Ops: []Op{{Type: OpPut, Key: "jobs/j", Value: []byte("v")}}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("a key in a table: %v", err)
	}
}
