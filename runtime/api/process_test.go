package api

import (
	"errors"
	"strings"
	"testing"
)

// TestProcessGangSpec checks a process gang's defaults and the errors of bad specs.
func TestProcessGangSpec(t *testing.T) {
	ok := GangSpec{Job: "j", Name: "g", Workers: 2, Process: &ProcessSpec{Command: []string{"python3", "x.py"}, NoticeSignal: "usr2"}}
	if err := ok.Normalize(); err != nil {
		t.Fatal(err)
	}
	if ok.Kind != ProcessKind || ok.Process.NoticeSignal != "SIGUSR2" || ok.Process.YieldExitCode != DefaultYieldExitCode {
		t.Fatalf("normalized to kind %q, signal %q, yield code %d", ok.Kind, ok.Process.NoticeSignal, ok.Process.YieldExitCode)
	}
	for _, tc := range []struct {
		name string
		edit func(s *GangSpec)
		err  string
	}{
		{"no command", func(s *GangSpec) { s.Process.Command = nil }, "has no command"},
		{"empty executable", func(s *GangSpec) { s.Process.Command = []string{""} }, "has no command"},
		{"a kind", func(s *GangSpec) { s.Kind = "counter" }, "runs its command, not a kind"},
		{"a driver", func(s *GangSpec) { s.Driver = true }, "both a process gang and a driver"},
		{"env without =", func(s *GangSpec) { s.Process.Env = []string{"X"} }, "want NAME=value"},
		{"env of Atoll's", func(s *GangSpec) { s.Process.Env = []string{"ATOLL_RANK=3"} }, "ATOLL_ variables"},
		{"env of torchrun's", func(s *GangSpec) { s.Process.Env = []string{"MASTER_PORT=1"} }, "MASTER_PORT is the agent's"},
		{"unknown signal", func(s *GangSpec) { s.Process.NoticeSignal = "SIGKILL" }, "notice signal"},
		{"yield code out of range", func(s *GangSpec) { s.Process.YieldExitCode = 256 }, "yield exit code 256"},
		{"yield code permanent", func(s *GangSpec) { s.Process.YieldExitCode = ExitPermanent }, "yield exit code 78"},
		{"process kind without a process", func(s *GangSpec) { s.Process = nil; s.Kind = ProcessKind }, "no process to run"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := GangSpec{Job: "j", Name: "g", Workers: 2, Process: &ProcessSpec{Command: []string{"python3"}}}
			tc.edit(&s)
			err := s.Normalize()
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("err %v, want ErrInvalid saying %q", err, tc.err)
			}
		})
	}
}
