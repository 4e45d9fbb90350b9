// Package jsoncheck finds what a JSON answer should never hold: a null where a reader
// expects a list or an object (a Go nil slice or map marshals as null, and a page that
// calls .filter or .length on it fails).
//
//	if nulls := jsoncheck.Nulls(b); len(nulls) > 0 {
//		t.Errorf("nulls at %v", nulls)
//	}
package jsoncheck

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
)

// Nulls returns the paths of every null in the JSON document b ("$.gangs",
// "$.racks[0].machines[1].islands"), sorted; an error when b is not JSON.
func Nulls(b []byte) ([]string, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("jsoncheck: %w", err)
	}
	var out []string
	walk("$", v, &out)
	sort.Strings(out)
	return out, nil
}

// Marshal marshals v and returns the paths of its nulls.
func Marshal(v any) ([]string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("jsoncheck: %w", err)
	}
	return Nulls(b)
}

func walk(path string, v any, out *[]string) {
	switch x := v.(type) {
	case nil:
		*out = append(*out, path)
	case map[string]any:
		for k, e := range x {
			walk(path+"."+k, e, out)
		}
	case []any:
		for i, e := range x {
			walk(path+"["+strconv.Itoa(i)+"]", e, out)
		}
	}
}
