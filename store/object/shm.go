package object

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// createShm creates path exclusively, sizes it and maps it read-write and shared.
// The returned slice is the mapping; size 0 yields a nil slice and no mapping.
func createShm(path string, size int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("object: create shm %s: %w", path, err)
	}
	defer f.Close()
	if size == 0 {
		return nil, nil
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("object: allocate shm %s (%d bytes): %w", path, size, err)
	}
	b, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("object: mmap shm %s (%d bytes): %w", path, size, err)
	}
	return b, nil
}

func unmap(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	return unix.Munmap(b)
}
