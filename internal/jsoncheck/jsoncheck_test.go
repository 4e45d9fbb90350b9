package jsoncheck

import (
	"reflect"
	"testing"
)

func TestNulls(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{`{"a": [], "b": {}, "c": 0, "d": ""}`, nil},
		{`{"gangs": null}`, []string{"$.gangs"}},
		{`{"racks": [{"machines": [{"islands": null}]}], "x": [1, null]}`, []string{"$.racks[0].machines[0].islands", "$.x[1]"}},
		{`null`, []string{"$"}},
	} {
		got, err := Nulls([]byte(tc.in))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Nulls(%s) = %v, want %v", tc.in, got, tc.want)
		}
	}
	if _, err := Nulls([]byte(`{"a":`)); err == nil {
		t.Error("a truncated document gave no error")
	}
	got, err := Marshal(struct {
		L []int `json:"l"`
		M map[string]int
	}{})
	if err != nil || !reflect.DeepEqual(got, []string{"$.M", "$.l"}) {
		t.Errorf("Marshal of nil slice and map: %v, %v", got, err)
	}
}
