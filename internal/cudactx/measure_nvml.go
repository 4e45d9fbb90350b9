//go:build nvml && cgo

package cudactx

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;

typedef CUresult (*cuInit_t)(unsigned int);
typedef CUresult (*cuDeviceGet_t)(CUdevice *, int);
typedef CUresult (*cuDeviceGetName_t)(char *, int, CUdevice);
typedef CUresult (*cuCtxCreate_t)(CUcontext *, unsigned int, CUdevice);
typedef CUresult (*cuCtxDestroy_t)(CUcontext);

static void *lib;
static cuInit_t p_cuInit;
static cuDeviceGet_t p_cuDeviceGet;
static cuDeviceGetName_t p_cuDeviceGetName;
static cuCtxCreate_t p_cuCtxCreate;
static cuCtxDestroy_t p_cuCtxDestroy;

static int load(void) {
	if (lib) return 0;
	lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!lib) return -1;
	p_cuInit = (cuInit_t)dlsym(lib, "cuInit");
	p_cuDeviceGet = (cuDeviceGet_t)dlsym(lib, "cuDeviceGet");
	p_cuDeviceGetName = (cuDeviceGetName_t)dlsym(lib, "cuDeviceGetName");
	p_cuCtxCreate = (cuCtxCreate_t)dlsym(lib, "cuCtxCreate_v2");
	p_cuCtxDestroy = (cuCtxDestroy_t)dlsym(lib, "cuCtxDestroy_v2");
	if (!p_cuInit || !p_cuDeviceGet || !p_cuDeviceGetName || !p_cuCtxCreate || !p_cuCtxDestroy) return -2;
	return 0;
}
static CUresult c_init(void) { return p_cuInit(0); }
static CUresult c_device(CUdevice *d) { return p_cuDeviceGet(d, 0); }
static CUresult c_name(char *buf, int n, CUdevice d) { return p_cuDeviceGetName(buf, n, d); }
static CUresult c_create(CUcontext *c, CUdevice d) { return p_cuCtxCreate(c, 0, d); }
static CUresult c_destroy(CUcontext c) { return p_cuCtxDestroy(c); }
*/
import "C"

import (
	"fmt"
	"runtime"
	"time"
	"unsafe"
)

// Measure creates and destroys a CUDA context on device 0 of the visible devices and times
// each part. It locks the calling goroutine to its thread while it runs (a context is
// current on a thread).
func Measure() (Result, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if rc := C.load(); rc != 0 {
		return Result{}, fmt.Errorf("%w: libcuda.so.1 could not be loaded (%d)", ErrUnavailable, int(rc))
	}
	var r Result
	t := time.Now()
	if rc := C.c_init(); rc != 0 {
		return r, fmt.Errorf("%w: cuInit: CUDA error %d", ErrUnavailable, int(rc))
	}
	r.Init = time.Since(t)
	var dev C.CUdevice
	if rc := C.c_device(&dev); rc != 0 {
		return r, fmt.Errorf("%w: cuDeviceGet(0): CUDA error %d", ErrUnavailable, int(rc))
	}
	buf := make([]byte, 256)
	if rc := C.c_name((*C.char)(unsafe.Pointer(&buf[0])), C.int(len(buf)), dev); rc == 0 {
		r.Device = C.GoString((*C.char)(unsafe.Pointer(&buf[0])))
	}
	var ctx C.CUcontext
	t = time.Now()
	if rc := C.c_create(&ctx, dev); rc != 0 {
		return r, fmt.Errorf("cudactx: cuCtxCreate: CUDA error %d", int(rc))
	}
	r.Create = time.Since(t)
	t = time.Now()
	if rc := C.c_destroy(ctx); rc != 0 {
		return r, fmt.Errorf("cudactx: cuCtxDestroy: CUDA error %d", int(rc))
	}
	r.Destroy = time.Since(t)
	return r, nil
}
