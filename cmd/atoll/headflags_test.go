package main

import (
	"strings"
	"testing"
)

func TestParsePeers(t *testing.T) {
	cases := []struct {
		in      string
		want    int
		wantErr string
	}{
		{"1=127.0.0.1:7001,2=127.0.0.1:7002,3=127.0.0.1:7003", 3, ""},
		{" 1=a:1 , 2=b:2 ,", 2, ""},
		{"1=a:1,1=b:2", 0, "listed twice"},
		{"x=a:1", 0, "entry 1"},
		{"1=a:1,2", 0, "entry 2"},
		{"0=a:1", 0, "entry 1"},
		{"70000=a:1", 0, "entry 1"},
		{"1=", 0, "entry 1"},
	}
	for _, tc := range cases {
		got, err := parsePeers(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("parsePeers(%q) error %v, want it to mention %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || len(got) != tc.want {
			t.Errorf("parsePeers(%q) = %v, %v", tc.in, got, err)
		}
	}
}

func TestHeadRefusesWithoutTokenOrDir(t *testing.T) {
	t.Setenv("ATOLL_TOKEN", "")
	for _, args := range [][]string{
		{"head", "--id", "1", "--peers", "1=127.0.0.1:0", "--data-dir", t.TempDir()},
		{"head", "--id", "1", "--peers", "1=127.0.0.1:0", "--token", "secret-token"},
		{"head", "--id", "1", "--peers", "1=", "--token", "secret-token", "--data-dir", t.TempDir()},
	} {
		root := newRootCmd()
		root.SetArgs(args)
		if err := root.Execute(); err == nil {
			t.Errorf("atoll %v: no error", args)
		}
	}
}
