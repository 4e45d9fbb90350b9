package topology

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// box is a valid one-GPU machine type for spec bodies; %s is spliced in before the GPUs.
const box = `{"nvlink": {"generation": 4, "linkGBps": 25, "fabric": "direct"}, %s
  "gpus": [{"model": "A", "memoryMiB": 1000}]}`

// TestSpecNamesCannotLeaveADirectory: a machine type or machine name becomes a directory
// name (the agent's object store); a name that could leave its directory, or that is not a
// portable file name, is refused with the file, line, column and field (issue 14 #1).
func TestSpecNamesCannotLeaveADirectory(t *testing.T) {
	tests := []struct {
		name string
		body string
		want []string // substrings of the error
	}{
		{"type key climbs out", `{
  "machineTypes": {
    "../../../tmp/x/victim": ` + fmt.Sprintf(box, "") + `
  },
  "machines": [{"type": "../../../tmp/x/victim"}]
}`, []string{`spec.json:3:30: machineTypes["../../../tmp/x/victim"]: machine type name "../../../tmp/x/victim" starts with '.'`,
			`spec.json:6:25: machines[0].type: machine type name "../../../tmp/x/victim" starts with '.'`}},
		{"type name differs from its key", `{
  "machineTypes": {"box": ` + fmt.Sprintf(box, `"name": "../x",`) + `},
  "machines": [{"type": "box"}]
}`, []string{`spec.json:2:101: machineTypes.box.name: name "../x" starts with '.'`, `differs from the machine type's key "box"`}},
		{"inline machine name", `{"machines": [
  {"machine": ` + fmt.Sprintf(box, `"name": "a/b",`) + `}]}`,
			[]string{`spec.json:2:89: machines[0].machine.name: name "a/b" has '/' at byte 1`}},
		{"machine file name", "{\n\"name\": \"/etc\",\n" + strings.TrimPrefix(fmt.Sprintf(box, ""), "{"),
			[]string{`spec.json:2:9: name: name "/etc" has '/' at byte 0`}},
		{"absolute type", `{"machines": [{"type": "/tmp/x"}]}`, []string{`spec.json:1:24: machines[0].type`, `has '/' at byte 0`}},
		{"dash", `{"machines": [{"type": "-rf"}]}`, []string{`machines[0].type`, `starts with '-'`}},
		{"dot dot", `{"machines": [{"type": ".."}]}`, []string{`machines[0].type`, `starts with '.'`}},
		{"NUL", `{"machines": [{"type": "a\u0000b"}]}`, []string{`machines[0].type`, `has '\x00' at byte 1`}},
		{"space", `{"machines": [{"type": "dgx h100"}]}`, []string{`machines[0].type`, `has ' ' at byte 3`}},
		{"empty key", `{"machineTypes": {"": ` + fmt.Sprintf(box, "") + `}, "machines": [{"type": "dgx-h100"}]}`,
			[]string{`machineTypes[""]: machine type name is empty`}},
		{"too long", `{"machines": [{"type": "` + strings.Repeat("a", 129) + `"}]}`, []string{`machines[0].type`, `is 129 bytes long`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := writeSpec(t, tt.body)
			_, err := ParseSpecFile(p)
			if !errors.Is(err, ErrInvalidSpec) {
				t.Fatalf("err = %v, want ErrInvalidSpec", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error\n%v\ndoes not contain\n%s", err, w)
				}
			}
			if _, err := Load(p); !errors.Is(err, ErrInvalidSpec) {
				t.Errorf("Load: err = %v, want ErrInvalidSpec", err)
			}
		})
	}

	// Names that are fine.
	c := mustLoad(t, writeSpec(t, `{"machineTypes": {"Host_01.lab-a": `+fmt.Sprintf(box, "")+`}, "machines": [{"type": "Host_01.lab-a", "count": 2}]}`))
	if got := c.Machines[1].Name; got != "Host_01.lab-a-1" {
		t.Fatalf("machine name %q", got)
	}

	// The head builds its cluster from names agents report: the same rule, and no two alike.
	m, _ := BuiltinMachine("dgx-h100")
	for _, insts := range [][]MachineInstance{
		{{Name: "../victim", Spec: m}},
		{{Name: "a", Spec: m}, {Name: "a", Spec: m}},
		{{Spec: &MachineSpec{Name: "../x", GPUs: m.GPUs}}},
	} {
		if _, err := BuildMachines(insts, NetworkSpec{}); !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("BuildMachines(%q...): err = %v, want ErrInvalidSpec", insts[0].Name, err)
		}
	}
	// Go callers get the same check.
	if _, err := Build(&ClusterSpec{Machines: []MachineGroup{{Machine: &MachineSpec{Name: "x/../../y", GPUs: m.GPUs}}}}); !errors.Is(err, ErrInvalidSpec) {
		t.Errorf("Build: err = %v", err)
	}
}

// TestSpecNumbersWithinBounds: every number in a spec is checked against its documented
// bound, with the file, line, field and bound in the message, and nothing exhausts memory
// (issue 14 #7).
func TestSpecNumbersWithinBounds(t *testing.T) {
	machine := func(gpu, rest string) string {
		return `{"nvlink": {"generation": 4, "linkGBps": 25, "fabric": "nvswitch"},
 "numaNodes": [{"id": 0, "cpus": 8}], "nics": [{"name": "n0", "speedGbps": 100, "numa": 0}],` + rest + `
 "gpus": [{"model": "A", "memoryMiB": 1000` + gpu + `}]}`
	}
	cluster := func(group, network string) string {
		return `{"machines": [` + group + `],
 "network": {` + network + `}}`
	}
	tests := []struct {
		name string
		body string
		err  error
		want []string
	}{
		{"count overflows", cluster(`{"type": "dgx-h100", "count": 2305843009213693952}`, ""), ErrInvalidSpec,
			[]string{"spec.json:1:45: machines[0].count: 2305843009213693952 is out of range 0..1048576"}},
		{"count negative", cluster(`{"type": "dgx-h100", "count": -1}`, ""), ErrInvalidSpec, []string{"machines[0].count: -1 is out of range 0..1048576"}},
		{"count exponent", cluster(`{"type": "dgx-h100", "count": 1e12}`, ""), ErrSyntax, []string{"spec.json:1:", "machines.count", "number 1e12"}},
		{"count fraction", cluster(`{"type": "dgx-h100", "count": 1.5}`, ""), ErrSyntax, []string{"machines.count", "number 1.5"}},
		{"too many GPUs", cluster(`{"type": "dgx-h100", "count": 131073}`, ""), ErrInvalidSpec,
			[]string{"machines[0].count: the cluster would hold more than 1048576 GPUs"}},
		{"too many GPUs over groups", cluster(`{"type": "dgx-h100", "count": 131072}, {"type": "dgx-h100"}`, ""), ErrInvalidSpec,
			[]string{"machines[1].count: the cluster would hold more than 1048576 GPUs"}},
		{"rack size", cluster(`{"type": "dgx-h100", "rackSize": -3}`, ""), ErrInvalidSpec, []string{"machines[0].rackSize: -3 is out of range 0..1048576"}},
		{"oversubscription", cluster(`{"type": "dgx-h100"}`, `"oversubscription": 1e9`), ErrInvalidSpec,
			[]string{"spec.json:2:34: network.oversubscription: 1e+09 is out of range 0..1000"}},
		{"oversubscription below 1", cluster(`{"type": "dgx-h100"}`, `"oversubscription": 0.5`), ErrInvalidSpec, []string{"network.oversubscription: 0.5 is below 1"}},
		{"latency", cluster(`{"type": "dgx-h100"}`, `"leafLatencyUs": -1, "spineLatencyUs": 1e300`), ErrInvalidSpec,
			[]string{"network.leafLatencyUs: -1 is out of range 0..1e+06", "network.spineLatencyUs: 1e+300 is out of range"}},
		{"float too large for JSON", cluster(`{"type": "dgx-h100"}`, `"leafLatencyUs": 1e400`), ErrSyntax, []string{"network.leafLatencyUs"}},
		{"GPU memory", machine(`, "memoryMiB": 1e15`, ""), ErrSyntax, []string{"gpus.memoryMiB", "1e15"}},
		{"GPU memory huge", machine(`, "memoryMiB": 1000000000000000`, ""), ErrInvalidSpec, []string{"spec.json:3:", "gpus[0].memoryMiB: 1000000000000000 is out of range 1..16777216"}},
		{"GPU NUMA", machine(`, "numa": -1`, ""), ErrInvalidSpec, []string{"gpus[0].numa: -1 is out of range 0..1023"}},
		{"link count", machine(`, "nvswitchLinks": 100000`, ""), ErrInvalidSpec, []string{"gpus[0].nvswitchLinks: 100000 is out of range 0..64"}},
		{"link speed", strings.Replace(machine("", ""), `"linkGBps": 25`, `"linkGBps": 1e300`, 1), ErrInvalidSpec,
			[]string{"spec.json:1:42: nvlink.linkGBps: 1e+300 is out of range: want more than 0 and at most 10000"}},
		{"generation", strings.Replace(machine("", ""), `"generation": 4`, `"generation": 0`, 1), ErrInvalidSpec, []string{"nvlink.generation: 0 is out of range 1..16"}},
		{"NIC speed", strings.Replace(machine("", ""), `"speedGbps": 100`, `"speedGbps": -100`, 1), ErrInvalidSpec,
			[]string{"spec.json:2:76: nics[0].speedGbps: -100 is out of range"}},
		{"NUMA cpus", strings.Replace(machine("", ""), `"cpus": 8`, `"cpus": 100000000`, 1), ErrInvalidSpec, []string{"numaNodes[0].cpus: 100000000 is out of range 0..65536"}},
		{"host memory", machine("", ` "hostMemoryMiB": -5,`), ErrInvalidSpec, []string{"hostMemoryMiB: -5 is out of range 0..1073741824"}},
		{"domain size", machine("", ` "nvlinkDomainSize": 5000,`), ErrInvalidSpec, []string{"nvlinkDomainSize: 5000 is out of range 0..1024"}},
		{"MIG instances", machine(`, "mig": {"enabled": true, "instances": [`+strings.Repeat(`{"profile": "1g.1gb"}, `, 8)+`{"profile": "1g.1gb"}]}`, ""), ErrInvalidSpec,
			[]string{"gpus[0].mig.instances: 9 instances, a GPU has at most 7"}},
		{"MIG profile numbers", machine(`, "mig": {"enabled": true, "instances": [{"profile": "99999999999999999999g.1gb"}]}`, ""), ErrInvalidSpec,
			[]string{"gpus[0].mig.instances[0].profile"}},
		{"GPUs per machine", `{"gpus": [` + strings.TrimSuffix(strings.Repeat(`{"model": "A", "memoryMiB": 1}, `, 1025), ", ") + `]}`, ErrInvalidSpec,
			[]string{"gpus: 1025 GPUs in one machine, at most 1024"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := writeSpec(t, tt.body)
			_, err := Load(p)
			if !errors.Is(err, tt.err) {
				t.Fatalf("err = %v, want %v", err, tt.err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error\n%v\ndoes not contain\n%s", err, w)
				}
			}
		})
	}
	// The largest cluster allowed builds (1.6 s, ~300 MiB): with ATOLL_LONG=1.
	if os.Getenv("ATOLL_LONG") == "" {
		return
	}
	c, err := Load(writeSpec(t, cluster(`{"type": "dgx-h100", "count": 131072, "rackSize": 32}`, "")))
	if err != nil || c.NumGPUs() != MaxGPUs {
		t.Fatalf("MaxGPUs GPUs: %v", err)
	}
}

// TestShorthandNumbersWithinBounds: counts and rack sizes of a shorthand are whole numbers
// in 1..MaxGPUs; the message names the part, the byte offset and the bound.
func TestShorthandNumbersWithinBounds(t *testing.T) {
	tests := []struct {
		in   string
		err  error
		want string
	}{
		{"1e12xdgx-h100", ErrShorthand, `part 1 ("1e12xdgx-h100"): count "1e12" at byte 0 must be a whole number in 1..1048576`},
		{"4xdgx-h100/0", ErrShorthand, `rack size "0" at byte 11 must be a whole number in 1..1048576`},
		{"2305843009213693952xdgx-h100", ErrShorthand, `count "2305843009213693952" at byte 0`},
		{"9999999999999999999xdgx-h100", ErrShorthand, `count "9999999999999999999" at byte 0`},
		{"4.5xdgx-h100", ErrShorthand, `count "4.5"`},
		{"-4xdgx-h100", ErrShorthand, `count "-4"`},
		{"+4xdgx-h100", ErrShorthand, `part 1 (""): is empty`},
		{"0xdgx-h100", ErrShorthand, `count "0"`},
		{"4xdgx-h100/1.5", ErrShorthand, `rack size "1.5" at byte 11`},
		{"dgx-h100+4xdgx-h100/-1", ErrShorthand, `part 2 ("4xdgx-h100/-1"): rack size "-1" at byte 20`},
		{"dgx-h100++dgx-h100", ErrShorthand, `part 2 (""): is empty`},
		{"dgx-h100+", ErrShorthand, `part 2 (""): is empty`},
		{"4x..", ErrShorthand, `machine type at byte 2: name ".." starts with '.'`},
		{"4x../../x", ErrShorthand, `rack size "x" at byte 8`},
		{"4x/8", ErrShorthand, `machine type at byte 2: name is empty`},
		{"4xdgx-h999", ErrUnknownMachine, `machine type "dgx-h999"`},
		{"131073xdgx-h100", ErrInvalidSpec, `machines[0].count: the cluster would hold more than 1048576 GPUs`},
		{"100000xdgx-h100+100000xdgx-h100", ErrInvalidSpec, `machines[1].count: the cluster would hold more than 1048576 GPUs`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			_, err := ParseShorthand(tt.in)
			if !errors.Is(err, tt.err) {
				t.Fatalf("err = %v, want %v", err, tt.err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error\n%v\ndoes not contain\n%s", err, tt.want)
			}
			if _, err := Load(tt.in); !errors.Is(err, tt.err) {
				t.Errorf("Load: err = %v", err)
			}
		})
	}
}

// TestGoSpecsRejectNaNAndInf: JSON cannot carry NaN or Inf, but a Go caller can.
func TestGoSpecsRejectNaNAndInf(t *testing.T) {
	for _, v := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		m, _ := BuiltinMachine("dgx-h100")
		m.NICs[0].SpeedGbps = v
		if err := m.Validate(); !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), "nics[0].speedGbps") {
			t.Errorf("NIC speed %v: %v", v, err)
		}
		m, _ = BuiltinMachine("dgx-h100")
		m.NVLink.LinkGBps = v
		if _, err := BuildMachines([]MachineInstance{{Spec: m}}, NetworkSpec{}); !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("link speed %v: %v", v, err)
		}
		if _, err := Build(&ClusterSpec{Machines: []MachineGroup{{Type: "dgx-h100"}}, Network: NetworkSpec{Oversubscription: v}}); !errors.Is(err, ErrInvalidSpec) ||
			!strings.Contains(err.Error(), "network.oversubscription") {
			t.Errorf("oversubscription %v: %v", v, err)
		}
		if _, err := BuildMachines(nil, NetworkSpec{SpineLatencyUs: v}); !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("BuildMachines spine latency %v: %v", v, err)
		}
		p := DefaultModelParams()
		p.NVLinkLatencyUs = v
		if err := p.Validate(); !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("model latency %v: %v", v, err)
		}
		p = DefaultModelParams()
		p.NoNICGbps = v
		if err := p.Validate(); !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("model NoNICGbps %v: %v", v, err)
		}
	}
}

// TestBuiltClusterNamesStayInTheirDirectory: whatever a valid spec says, every machine name
// is one path element that stays inside the directory it is joined to.
func TestBuiltClusterNamesStayInTheirDirectory(t *testing.T) {
	for _, s := range append(BuiltinNames(), "testdata/example-cluster.json", "16xdgx-h100/8+8xpcie-l40s-8") {
		for _, m := range mustLoad(t, s).Machines {
			if !filepath.IsLocal(m.Name) || filepath.Base(m.Name) != m.Name || checkName(m.Type) != nil {
				t.Fatalf("%s: machine %q of type %q", s, m.Name, m.Type)
			}
		}
	}
}
