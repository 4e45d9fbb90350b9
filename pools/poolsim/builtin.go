package poolsim

import (
	"github.com/atoll-run/atoll/pools"
)

// BuiltinPools is the pool set the simulation uses without --pools: DGX H100 machines
// (8 × H100 80GB) on demand and on spot, 32 of each at most.
//
// Prices and rates are declared, not measured: on-demand 98.32 USD/h is AWS's published
// on-demand price of p5.48xlarge (8 × H100) in us-east-1 (2024); spot at 40% of it
// (39.33 USD/h) is the typical discount AWS quotes for spot ("up to 90%", with GPU types
// at the shallow end); the interruption rate, 0.01 per machine-hour (about one
// interruption per machine every four days), is a pessimistic reading of AWS's Spot
// Instance Advisor, whose worst bucket for GPU instances is ">20%" of instances
// interrupted per month; the notice is AWS's 120 s; launch latency 3 min.
const BuiltinPools = `{"pools": [
  {"name": "h100", "machine": "dgx-h100", "min": 0, "max": 32, "capacity": "on-demand", "price_per_hour": 98.32,
   "launch_latency": "3m", "idle_timeout": "5m", "provider": {"type": "sim"},
   "source": "AWS p5.48xlarge on-demand, us-east-1, 2024"},
  {"name": "h100-spot", "machine": "dgx-h100", "min": 0, "max": 32, "capacity": "spot", "price_per_hour": 39.33,
   "launch_latency": "3m", "idle_timeout": "5m", "interruptions_per_hour": 0.01, "notice_seconds": 120, "provider": {"type": "sim"},
   "source": "40% of on-demand; interruption rate read pessimistically from the AWS Spot Instance Advisor's >20%/month bucket"}
]}`

// Builtin parses BuiltinPools.
func Builtin() (*pools.Set, error) { return pools.Parse([]byte(BuiltinPools), "built-in pools", "") }
