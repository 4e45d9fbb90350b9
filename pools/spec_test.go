package pools

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestLoadFile(t *testing.T) {
	set, err := LoadFile("testdata/pools.json")
	if err != nil {
		t.Fatal(err)
	}
	if len(set.Pools) != 2 {
		t.Fatalf("%d pools", len(set.Pools))
	}
	od, spot := set.Pools[0], set.Pools[1]
	if od.Spec.Capacity != OnDemand || time.Duration(od.Spec.LaunchLatency) != 3*time.Minute || od.Spec.Budget.USDPerHour != 400 {
		t.Errorf("on-demand pool %+v", od.Spec)
	}
	if spot.Spec.Capacity != Spot || time.Duration(spot.Spec.IdleTimeout) != 10*time.Minute || spot.Spec.Min != 0 {
		t.Errorf("spot pool defaults %+v", spot.Spec)
	}
	if od.Shape.GPUs != 8 || len(od.Shape.Islands) != 1 || od.Shape.Islands[0] != 8 || od.MachineSpec.Name != "dgx-h100" {
		t.Errorf("shape %+v", od.Shape)
	}
	if p, ok := set.ByName("h100-spot"); !ok || p.Spec.PricePerHour != 39.33 {
		t.Errorf("ByName: %v %v", p, ok)
	}
}

func TestMachineSpecFileRelative(t *testing.T) {
	dir := t.TempDir()
	src, err := os.ReadFile("../topology/machines/pcie-l40s-8.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "box.json"), src, 0o600); err != nil {
		t.Fatal(err)
	}
	set, err := Parse([]byte(`{"pools": [{"name": "l40s", "machine": "box.json", "max": 2, "price_per_hour": 8, "provider": {"type": "sim"}}]}`), "p.json", dir)
	if err != nil {
		t.Fatal(err)
	}
	if sh := set.Pools[0].Shape; sh.GPUs != 8 || len(sh.Islands) != 8 {
		t.Fatalf("PCIe box shape %+v: want 8 islands of 1", sh)
	}
}

func TestSpecErrors(t *testing.T) {
	pool := func(fields string) string {
		return "{\"pools\": [\n  {\"name\": \"ok\", \"machine\": \"dgx-h100\", \"max\": 1, \"price_per_hour\": 1, \"provider\": {\"type\": \"sim\"}},\n  {" + fields + "}\n]}"
	}
	base := `"name": "p", "machine": "dgx-h100", "max": 2, "price_per_hour": 10, "provider": {"type": "sim"}`
	cases := []struct {
		name, data, want string
	}{
		{"syntax", `{"pools": [ {"name": "p",, } ]}`, "p.json:1:26: invalid character ','"},
		{"unknown field", pool(base + `, "maxx": 3`), `p.json:3:`},
		{"wrong type", pool(`"name": "p", "max": "two"`), "field pools.max: expected int"},
		{"no pools", `{"pools": []}`, "no pools"},
		{"bad name", pool(`"name": "-x", "machine": "dgx-h100", "max": 2, "provider": {"type": "sim"}`), `p.json:3:3: pools[1] ("-x").name`},
		{"duplicate", pool(`"name": "ok", "machine": "dgx-h100", "max": 2, "provider": {"type": "sim"}`), `pools[1] ("ok").name: "ok" is also the name of pools[0]`},
		{"min above max", pool(base + `, "min": 3`), `pools[1] ("p").min: 3 is above max 2`},
		{"max zero", pool(`"name": "p", "machine": "dgx-h100", "price_per_hour": 1, "provider": {"type": "sim"}`), `pools[1] ("p").max: 0: want 1..100000`},
		{"capacity", pool(base + `, "capacity": "reserved"`), `.capacity: "reserved"`},
		{"negative price", pool(`"name": "p", "machine": "dgx-h100", "max": 2, "price_per_hour": -1, "provider": {"type": "sim"}`), `.price_per_hour: -1`},
		{"bad duration", pool(base + `, "idle_timeout": "soon"`), `duration "soon"`},
		{"interruptions on on-demand", pool(base + `, "interruptions_per_hour": 0.1`), `.interruptions_per_hour: 0.1 on an on-demand pool`},
		{"provider", pool(`"name": "p", "machine": "dgx-h100", "max": 2, "provider": {"type": "ec2"}`), `.provider.type: "ec2": want one of local, docker, kubernetes, sim`},
		{"machine", pool(`"name": "p", "machine": "dgx-h999", "max": 2, "provider": {"type": "sim"}`), `pools[1] ("p").machine:`},
		{"budget below min", pool(base + `, "min": 2, "budget": {"usd_per_hour": 15}`), `.budget.usd_per_hour: 15 cannot pay for the pool's min 2 machines`},
		{"trailing data", `{"pools": []} {}`, "data after the top-level object"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(c.data), "p.json", "")
			if err == nil {
				t.Fatalf("accepted:\n%s", c.data)
			}
			if !errors.Is(err, ErrSpec) {
				t.Errorf("error %v does not wrap ErrSpec", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not say %q", err, c.want)
			}
		})
	}
}
