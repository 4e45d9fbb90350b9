//go:build race

package sdk_test

func init() { raceDetector = true }
