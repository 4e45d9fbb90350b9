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

// sealShm makes a read-write mapping read-only: from now on a write through any
// view of it faults, which is what makes a handed-out view immutable.
func sealShm(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	return unix.Mprotect(b, unix.PROT_READ)
}

func unmap(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	return unix.Munmap(b)
}

// MapFile maps the shared-memory file of an object read-only, as a worker process
// on the same machine does with the path from Store.Map. The bytes are the store's
// own pages: nothing is copied. Call the returned function to unmap; the slice
// must not be used after that.
func MapFile(path string) ([]byte, func() error, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("object: map %s: %w", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, nil, fmt.Errorf("object: map %s: %w", path, err)
	}
	if st.Size() == 0 {
		return []byte{}, func() error { return nil }, nil
	}
	b, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, nil, fmt.Errorf("object: mmap %s: %w", path, err)
	}
	return b, func() error { return unix.Munmap(b) }, nil
}
