//go:build !(nvml && cgo)

package cudactx

// Measure says that this build has no CUDA driver access (build with -tags nvml).
func Measure() (Result, error) {
	return Result{}, ErrUnavailable
}
