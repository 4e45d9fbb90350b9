// Package object is one machine's object store: immutable objects in shared memory,
// reference counts with owners, and tiers (hot shared memory, warm host memory, cold
// compressed disk) with LRU spilling.
package object
