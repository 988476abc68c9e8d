// fakecuda runtime: a thin fake libcudart.so.13 for Spillway's GPU-less tests. Like the
// real CUDA 13 runtime it never links libcuda: on first use it does
// dlopen("libcuda.so.1"), dlsym(h, "cuGetProcAddress_v2"), asks that for
// "cuGetProcAddress" itself and resolves every other driver entry point through it
// (cudaVersion 13000; flags CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM for the _ptsz
// runtime variants). Signatures come from cuda_runtime_api.h, error codes from
// driver_types.h (CUDA 13.0).
//
// Kernels: a host stub (the address nvcc's generated code passes as `func`) is tied to one
// of the fake driver's CUfunctions by the test helper fakecudart_register_stub (the real
// runtime does it in __cudaRegisterFunction); cudaLaunchKernel(_ptsz) and
// cudaLaunchKernelExC(_ptsz) launch it through cuLaunchKernel(_ptsz) / cuLaunchKernelEx(_ptsz),
// and cudaGetFuncBySymbol answers its CUfunction. Built with
// FAKECUDART_WITHOUT_GET_FUNC_BY_SYMBOL (the no-get-func/ variant), the library has no
// cudaGetFuncBySymbol at all.
#include <dlfcn.h>

#include <cstring>
#include <mutex>
#include <unordered_map>

#include <cuda.h>
#pragma GCC visibility push(default)  // the runtime entry points we define are exported
#include <cuda_runtime_api.h>
#pragma GCC visibility pop

#define FAKECUDA_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

constexpr int kVersion = 13000;

// Driver entry points, typed from cuda.h's current declarations (decltype only: nothing
// here links against the driver).
struct Driver {
  decltype(&::cuGetProcAddress_v2) GetProcAddress = nullptr;
  decltype(&::cuInit) Init = nullptr;
  decltype(&::cuDriverGetVersion) DriverGetVersion = nullptr;
  decltype(&::cuDeviceGetCount) DeviceGetCount = nullptr;
  decltype(&::cuDeviceGet) DeviceGet = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) PrimaryCtxRetain = nullptr;
  decltype(&::cuCtxSetCurrent) CtxSetCurrent = nullptr;
  decltype(&::cuCtxGetDevice_v2) CtxGetDevice = nullptr;  // "cuCtxGetDevice" at 13000: the (device, ctx) ABI
  decltype(&::cuCtxSynchronize) CtxSynchronize = nullptr;
  decltype(&::cuMemAlloc_v2) MemAlloc = nullptr;
  decltype(&::cuMemAllocPitch_v2) MemAllocPitch = nullptr;
  decltype(&::cuMemAllocManaged) MemAllocManaged = nullptr;
  decltype(&::cuMemAllocAsync) MemAllocAsync = nullptr;
  decltype(&::cuMemAllocAsync) MemAllocAsyncPtsz = nullptr;
  decltype(&::cuMemFree_v2) MemFree = nullptr;
  decltype(&::cuMemFreeAsync) MemFreeAsync = nullptr;
  decltype(&::cuMemFreeAsync) MemFreeAsyncPtsz = nullptr;
  decltype(&::cuMemGetInfo_v2) MemGetInfo = nullptr;
  decltype(&::cuPointerGetAttributes) PointerGetAttributes = nullptr;
  decltype(&::cuMemcpy) Memcpy = nullptr;
  decltype(&::cuMemsetD8_v2) MemsetD8 = nullptr;
  decltype(&::cuStreamCreate) StreamCreate = nullptr;
  decltype(&::cuStreamDestroy_v2) StreamDestroy = nullptr;
  decltype(&::cuStreamSynchronize) StreamSynchronize = nullptr;
  decltype(&::cuStreamBeginCapture_v2) StreamBeginCapture = nullptr;
  decltype(&::cuStreamEndCapture) StreamEndCapture = nullptr;
  decltype(&::cuStreamIsCapturing) StreamIsCapturing = nullptr;
  decltype(&::cuIpcGetMemHandle) IpcGetMemHandle = nullptr;
  decltype(&::cuLaunchKernel) LaunchKernel = nullptr;
  decltype(&::cuLaunchKernel) LaunchKernelPtsz = nullptr;
  decltype(&::cuLaunchKernelEx) LaunchKernelEx = nullptr;
  decltype(&::cuLaunchKernelEx) LaunchKernelExPtsz = nullptr;
  CUcontext primary = nullptr;
};

Driver g_driver;
// cudaSetDevice: each device's primary context, retained once per process, as the runtime
// does (CUDA Runtime API, "Interactions with the CUDA Driver API": the runtime uses the
// device's primary context).
std::mutex g_primary_mutex;
CUcontext g_primaries[64] = {};
cudaError_t g_init_error = cudaSuccess;
std::once_flag g_init_once;
thread_local cudaError_t t_last_error = cudaSuccess;
thread_local bool t_context_bound = false;

cudaError_t to_cuda(CUresult r) {
  switch (r) {
    case CUDA_SUCCESS: return cudaSuccess;
    case CUDA_ERROR_INVALID_VALUE: return cudaErrorInvalidValue;
    case CUDA_ERROR_OUT_OF_MEMORY: return cudaErrorMemoryAllocation;
    case CUDA_ERROR_NOT_INITIALIZED: return cudaErrorInitializationError;
    case CUDA_ERROR_NO_DEVICE: return cudaErrorNoDevice;
    case CUDA_ERROR_INVALID_DEVICE: return cudaErrorInvalidDevice;
    case CUDA_ERROR_INVALID_IMAGE: return cudaErrorInvalidKernelImage;
    case CUDA_ERROR_INVALID_CONTEXT: return cudaErrorDeviceUninitialized;
    case CUDA_ERROR_INVALID_HANDLE: return cudaErrorInvalidResourceHandle;
    case CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE: return cudaErrorSetOnActiveProcess;
    case CUDA_ERROR_CONTEXT_IS_DESTROYED: return cudaErrorContextIsDestroyed;
    case CUDA_ERROR_ILLEGAL_STATE: return cudaErrorIllegalState;
    case CUDA_ERROR_NOT_FOUND: return cudaErrorSymbolNotFound;
    case CUDA_ERROR_NOT_READY: return cudaErrorNotReady;
    case CUDA_ERROR_ILLEGAL_ADDRESS: return cudaErrorIllegalAddress;
    case CUDA_ERROR_NOT_SUPPORTED: return cudaErrorNotSupported;
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: return cudaErrorStreamCaptureUnsupported;
    case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: return cudaErrorStreamCaptureInvalidated;
    default: return cudaErrorUnknown;
  }
}

template <class T>
bool resolve(T& out, const char* name, cuuint64_t flags = CU_GET_PROC_ADDRESS_DEFAULT) {
  void* p = nullptr;
  CUdriverProcAddressQueryResult status{};
  if (g_driver.GetProcAddress(name, &p, kVersion, flags, &status) != CUDA_SUCCESS || !p) return false;
  out = reinterpret_cast<T>(p);
  return true;
}

void init() {
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    g_init_error = cudaErrorInsufficientDriver;
    return;
  }
  auto bootstrap = reinterpret_cast<decltype(&::cuGetProcAddress_v2)>(::dlsym(lib, "cuGetProcAddress_v2"));
  void* gpa = nullptr;
  CUdriverProcAddressQueryResult status{};
  if (!bootstrap || bootstrap("cuGetProcAddress", &gpa, kVersion, 0, &status) != CUDA_SUCCESS || !gpa) {
    g_init_error = cudaErrorInsufficientDriver;
    return;
  }
  Driver& d = g_driver;
  d.GetProcAddress = reinterpret_cast<decltype(d.GetProcAddress)>(gpa);
  const cuuint64_t ptsz = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  bool ok = resolve(d.Init, "cuInit") && resolve(d.DriverGetVersion, "cuDriverGetVersion") &&
            resolve(d.DeviceGetCount, "cuDeviceGetCount") && resolve(d.DeviceGet, "cuDeviceGet") &&
            resolve(d.PrimaryCtxRetain, "cuDevicePrimaryCtxRetain") &&
            resolve(d.CtxSetCurrent, "cuCtxSetCurrent") && resolve(d.CtxGetDevice, "cuCtxGetDevice") &&
            resolve(d.CtxSynchronize, "cuCtxSynchronize") &&
            resolve(d.MemAlloc, "cuMemAlloc") && resolve(d.MemAllocPitch, "cuMemAllocPitch") &&
            resolve(d.MemAllocManaged, "cuMemAllocManaged") && resolve(d.MemAllocAsync, "cuMemAllocAsync") &&
            resolve(d.MemAllocAsyncPtsz, "cuMemAllocAsync", ptsz) && resolve(d.MemFree, "cuMemFree") &&
            resolve(d.MemFreeAsync, "cuMemFreeAsync") && resolve(d.MemFreeAsyncPtsz, "cuMemFreeAsync", ptsz) &&
            resolve(d.MemGetInfo, "cuMemGetInfo") && resolve(d.PointerGetAttributes, "cuPointerGetAttributes") &&
            resolve(d.Memcpy, "cuMemcpy") && resolve(d.MemsetD8, "cuMemsetD8") &&
            resolve(d.StreamCreate, "cuStreamCreate") && resolve(d.StreamDestroy, "cuStreamDestroy") &&
            resolve(d.StreamSynchronize, "cuStreamSynchronize") &&
            resolve(d.StreamBeginCapture, "cuStreamBeginCapture") &&
            resolve(d.StreamEndCapture, "cuStreamEndCapture") &&
            resolve(d.StreamIsCapturing, "cuStreamIsCapturing") &&
            resolve(d.IpcGetMemHandle, "cuIpcGetMemHandle") && resolve(d.LaunchKernel, "cuLaunchKernel") &&
            resolve(d.LaunchKernelPtsz, "cuLaunchKernel", ptsz) && resolve(d.LaunchKernelEx, "cuLaunchKernelEx") &&
            resolve(d.LaunchKernelExPtsz, "cuLaunchKernelEx", ptsz);
  if (!ok) {
    g_init_error = cudaErrorInsufficientDriver;
    return;
  }
  if (CUresult r = d.Init(0); r != CUDA_SUCCESS) {
    g_init_error = to_cuda(r);
    return;
  }
  if (CUresult r = d.PrimaryCtxRetain(&d.primary, 0); r != CUDA_SUCCESS) g_init_error = to_cuda(r);
  g_primaries[0] = d.primary;
}

// Lazy init, then the primary context is made current on this thread (once per thread).
cudaError_t ready() {
  std::call_once(g_init_once, init);
  if (g_init_error != cudaSuccess) return g_init_error;
  if (!t_context_bound) {
    if (CUresult r = g_driver.CtxSetCurrent(g_driver.primary); r != CUDA_SUCCESS) return to_cuda(r);
    t_context_bound = true;
  }
  return cudaSuccess;
}

cudaError_t record(cudaError_t e) {
  if (e != cudaSuccess) t_last_error = e;
  return e;
}

// Runs f() (returning a CUresult) after initialization; records errors as the last error.
template <class F>
cudaError_t call(F&& f) {
  if (cudaError_t e = ready(); e != cudaSuccess) return record(e);
  return record(to_cuda(f()));
}

CUdeviceptr dptr(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }

struct ErrorText {
  cudaError_t code;
  const char* name;
  const char* text;
};
constexpr ErrorText kErrors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidKernelImage, "cudaErrorInvalidKernelImage", "device kernel image is invalid"},
    {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
    {cudaErrorDeviceUninitialized, "cudaErrorDeviceUninitialized", "invalid device context"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorSetOnActiveProcess, "cudaErrorSetOnActiveProcess",
     "cannot set while device is active in this process"},
    {cudaErrorContextIsDestroyed, "cudaErrorContextIsDestroyed", "context is destroyed"},
    {cudaErrorIllegalState, "cudaErrorIllegalState", "the operation cannot be performed in the present state"},
    {cudaErrorSymbolNotFound, "cudaErrorSymbolNotFound", "named symbol not found"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};
const ErrorText* error_text(cudaError_t e) {
  for (const ErrorText& t : kErrors)
    if (t.code == e) return &t;
  return nullptr;
}

// ---- kernels: host stubs ---------------------------------------------------------------------
struct Stub {
  CUfunction function = nullptr;
  bool resolvable = true;  // cudaGetFuncBySymbol answers it
};
std::mutex g_stub_mutex;
std::unordered_map<const void*, Stub>& stubs() {
  static auto* m = new std::unordered_map<const void*, Stub>();  // never destroyed: used during exit
  return *m;
}

bool find_stub(const void* func, Stub* out) {
  std::lock_guard lock(g_stub_mutex);
  auto it = stubs().find(func);
  if (it == stubs().end()) return false;
  *out = it->second;
  return true;
}

// cudaLaunchKernel / cudaLaunchKernelExC: the stub's CUfunction, launched by the driver.
template <class F>
cudaError_t launch_stub(const void* func, F&& driver_launch) {
  if (cudaError_t e = ready(); e != cudaSuccess) return record(e);
  Stub stub;
  if (!func || !find_stub(func, &stub)) return record(cudaErrorInvalidDeviceFunction);
  return record(to_cuda(driver_launch(stub.function)));
}

cudaError_t launch(const void* func, dim3 grid, dim3 block, void** args, size_t shmem, cudaStream_t stream,
                   bool ptsz) {
  return launch_stub(func, [&](CUfunction f) {
    auto fn = ptsz ? g_driver.LaunchKernelPtsz : g_driver.LaunchKernel;
    return fn(f, grid.x, grid.y, grid.z, block.x, block.y, block.z, static_cast<unsigned>(shmem), stream, args,
              nullptr);
  });
}

// cudaLaunchAttribute and CUlaunchAttribute have the same layout (id, pad, value union).
static_assert(sizeof(cudaLaunchAttribute) == sizeof(CUlaunchAttribute));

cudaError_t launch_ex(const cudaLaunchConfig_t* config, const void* func, void** args, bool ptsz) {
  if (!config) return record(cudaErrorInvalidValue);
  return launch_stub(func, [&](CUfunction f) {
    CUlaunchConfig c{};
    c.gridDimX = config->gridDim.x;
    c.gridDimY = config->gridDim.y;
    c.gridDimZ = config->gridDim.z;
    c.blockDimX = config->blockDim.x;
    c.blockDimY = config->blockDim.y;
    c.blockDimZ = config->blockDim.z;
    c.sharedMemBytes = static_cast<unsigned>(config->dynamicSmemBytes);
    c.hStream = config->stream;
    c.attrs = reinterpret_cast<CUlaunchAttribute*>(config->attrs);
    c.numAttrs = config->numAttrs;
    return (ptsz ? g_driver.LaunchKernelExPtsz : g_driver.LaunchKernelEx)(&c, f, args, nullptr);
  });
}

cudaError_t entry_point(const char* symbol, void** fn, unsigned version, unsigned long long flags,
                        cudaDriverEntryPointQueryResult* status) {
  if (!symbol || !fn) return record(cudaErrorInvalidValue);
  std::call_once(g_init_once, init);
  if (g_init_error != cudaSuccess) return record(g_init_error);
  CUdriverProcAddressQueryResult st{};
  *fn = nullptr;
  CUresult r = g_driver.GetProcAddress(symbol, fn, static_cast<int>(version), flags, &st);
  if (status) *status = static_cast<cudaDriverEntryPointQueryResult>(st);
  // A missing symbol is reported through *status, not as an error (runtime API docs).
  return r == CUDA_ERROR_NOT_FOUND ? cudaSuccess : record(to_cuda(r));
}

}  // namespace

extern "C" {

cudaError_t CUDARTAPI cudaMalloc(void** p, size_t size) {
  if (!p) return record(cudaErrorInvalidValue);
  if (size == 0) {
    *p = nullptr;
    return cudaSuccess;
  }
  return call([&] { return g_driver.MemAlloc(reinterpret_cast<CUdeviceptr*>(p), size); });
}

cudaError_t CUDARTAPI cudaMallocPitch(void** p, size_t* pitch, size_t width, size_t height) {
  return call([&] { return g_driver.MemAllocPitch(reinterpret_cast<CUdeviceptr*>(p), pitch, width, height, 4); });
}

cudaError_t CUDARTAPI cudaMallocManaged(void** p, size_t size, unsigned int flags) {
  return call([&] { return g_driver.MemAllocManaged(reinterpret_cast<CUdeviceptr*>(p), size, flags); });
}

cudaError_t CUDARTAPI cudaMallocAsync(void** p, size_t size, cudaStream_t s) {
  return call([&] { return g_driver.MemAllocAsync(reinterpret_cast<CUdeviceptr*>(p), size, s); });
}
FAKECUDA_EXPORT cudaError_t CUDARTAPI cudaMallocAsync_ptsz(void** p, size_t size, cudaStream_t s) {
  return call([&] { return g_driver.MemAllocAsyncPtsz(reinterpret_cast<CUdeviceptr*>(p), size, s); });
}

cudaError_t CUDARTAPI cudaFree(void* p) {
  if (!p) return cudaSuccess;
  return call([&] { return g_driver.MemFree(dptr(p)); });
}

cudaError_t CUDARTAPI cudaFreeAsync(void* p, cudaStream_t s) {
  return call([&] { return g_driver.MemFreeAsync(dptr(p), s); });
}
FAKECUDA_EXPORT cudaError_t CUDARTAPI cudaFreeAsync_ptsz(void* p, cudaStream_t s) {
  return call([&] { return g_driver.MemFreeAsyncPtsz(dptr(p), s); });
}

cudaError_t CUDARTAPI cudaMemGetInfo(size_t* free, size_t* total) {
  return call([&] { return g_driver.MemGetInfo(free, total); });
}

cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned int version,
                                                       unsigned long long flags,
                                                       cudaDriverEntryPointQueryResult* status) {
  return entry_point(symbol, fn, version, flags, status);
}
FAKECUDA_EXPORT cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion_ptsz(const char* symbol, void** fn,
                                                                            unsigned int version,
                                                                            unsigned long long flags,
                                                                            cudaDriverEntryPointQueryResult* status) {
  if (flags == cudaEnableDefault) flags = cudaEnablePerThreadDefaultStream;
  return entry_point(symbol, fn, version, flags, status);
}
cudaError_t CUDARTAPI cudaGetDriverEntryPoint(const char* symbol, void** fn, unsigned long long flags,
                                              cudaDriverEntryPointQueryResult* status) {
  return entry_point(symbol, fn, kVersion, flags, status);
}
FAKECUDA_EXPORT cudaError_t CUDARTAPI cudaGetDriverEntryPoint_ptsz(const char* symbol, void** fn,
                                                                   unsigned long long flags,
                                                                   cudaDriverEntryPointQueryResult* status) {
  if (flags == cudaEnableDefault) flags = cudaEnablePerThreadDefaultStream;
  return entry_point(symbol, fn, kVersion, flags, status);
}

cudaError_t CUDARTAPI cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* ptr) {
  if (!attr) return record(cudaErrorInvalidValue);
  unsigned memory_type = 0, managed = 0;
  int device = 0;
  CUdeviceptr device_ptr = 0;
  void* host_ptr = nullptr;
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                 CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_DEVICE_POINTER,
                                 CU_POINTER_ATTRIBUTE_HOST_POINTER};
  void* data[] = {&memory_type, &managed, &device, &device_ptr, &host_ptr};
  cudaError_t e = call([&] { return g_driver.PointerGetAttributes(5, attrs, data, dptr(ptr)); });
  if (e != cudaSuccess) return e;
  *attr = {};
  attr->type = managed ? cudaMemoryTypeManaged
               : memory_type == CU_MEMORYTYPE_DEVICE ? cudaMemoryTypeDevice
               : memory_type == CU_MEMORYTYPE_HOST ? cudaMemoryTypeHost
                                                   : cudaMemoryTypeUnregistered;
  attr->device = device;
  attr->devicePointer = reinterpret_cast<void*>(device_ptr);
  attr->hostPointer = host_ptr;
  return cudaSuccess;
}

// Unified addressing: every direction is a cuMemcpy.
cudaError_t CUDARTAPI cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) return record(cudaErrorInvalidMemcpyDirection);
  return call([&] { return g_driver.Memcpy(dptr(dst), dptr(src), count); });
}

cudaError_t CUDARTAPI cudaMemset(void* p, int value, size_t count) {
  return call([&] { return g_driver.MemsetD8(dptr(p), static_cast<unsigned char>(value), count); });
}

cudaError_t CUDARTAPI cudaStreamCreate(cudaStream_t* s) {
  return call([&] { return g_driver.StreamCreate(s, CU_STREAM_DEFAULT); });
}
cudaError_t CUDARTAPI cudaStreamDestroy(cudaStream_t s) {
  return call([&] { return g_driver.StreamDestroy(s); });
}
cudaError_t CUDARTAPI cudaStreamSynchronize(cudaStream_t s) {
  return call([&] { return g_driver.StreamSynchronize(s); });
}
cudaError_t CUDARTAPI cudaDeviceSynchronize(void) {
  return call([&] { return g_driver.CtxSynchronize(); });
}
cudaError_t CUDARTAPI cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
  return call([&] { return g_driver.StreamBeginCapture(s, static_cast<CUstreamCaptureMode>(mode)); });
}
cudaError_t CUDARTAPI cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  return call([&] { return g_driver.StreamEndCapture(s, graph); });
}
cudaError_t CUDARTAPI cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
  return call([&] {
    return g_driver.StreamIsCapturing(s, reinterpret_cast<CUstreamCaptureStatus*>(status));
  });
}

const char* CUDARTAPI cudaGetErrorString(cudaError_t e) {
  const ErrorText* t = error_text(e);
  return t ? t->text : "unrecognized error code";
}
const char* CUDARTAPI cudaGetErrorName(cudaError_t e) {
  const ErrorText* t = error_text(e);
  return t ? t->name : "cudaErrorUnknown";
}
cudaError_t CUDARTAPI cudaGetLastError(void) {
  cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}
cudaError_t CUDARTAPI cudaPeekAtLastError(void) { return t_last_error; }

// Makes the device's primary context current to the calling thread, retaining it the first
// time ("cudaSetDevice ... Sets device as the current device for the calling host thread";
// a bad ordinal is cudaErrorInvalidDevice, CUDA Runtime API, Device Management).
cudaError_t CUDARTAPI cudaSetDevice(int device) {
  if (cudaError_t e = ready(); e != cudaSuccess) return record(e);
  int count = 0;
  if (CUresult r = g_driver.DeviceGetCount(&count); r != CUDA_SUCCESS) return record(to_cuda(r));
  if (device < 0 || device >= count || device >= 64) return record(cudaErrorInvalidDevice);
  CUcontext ctx = nullptr;
  {
    std::lock_guard lock(g_primary_mutex);
    if (!g_primaries[device]) {
      CUdevice dev = 0;
      if (CUresult r = g_driver.DeviceGet(&dev, device); r != CUDA_SUCCESS) return record(to_cuda(r));
      if (CUresult r = g_driver.PrimaryCtxRetain(&g_primaries[device], dev); r != CUDA_SUCCESS) {
        g_primaries[device] = nullptr;
        return record(to_cuda(r));
      }
    }
    ctx = g_primaries[device];
  }
  return record(to_cuda(g_driver.CtxSetCurrent(ctx)));
}
// The current context's device (whatever made it current: cudaSetDevice or the driver API).
cudaError_t CUDARTAPI cudaGetDevice(int* device) {
  if (!device) return record(cudaErrorInvalidValue);
  return call([&] {
    CUdevice dev = 0;
    CUresult r = g_driver.CtxGetDevice(&dev, nullptr);
    if (r == CUDA_SUCCESS) *device = dev;
    return r;
  });
}
// The visible devices; none is cudaErrorNoDevice with *count 0 (CUDA Runtime API, Device
// Management: cudaGetDeviceCount).
cudaError_t CUDARTAPI cudaGetDeviceCount(int* count) {
  if (!count) return record(cudaErrorInvalidValue);
  *count = 0;
  cudaError_t e = call([&] { return g_driver.DeviceGetCount(count); });
  if (e == cudaSuccess && *count == 0) return record(cudaErrorNoDevice);
  return e;
}

cudaError_t CUDARTAPI cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* p) {
  static_assert(sizeof(cudaIpcMemHandle_t) == sizeof(CUipcMemHandle));
  return call([&] { return g_driver.IpcGetMemHandle(reinterpret_cast<CUipcMemHandle*>(handle), dptr(p)); });
}

cudaError_t CUDARTAPI cudaLaunchKernel(const void* func, dim3 gridDim, dim3 blockDim, void** args, size_t sharedMem,
                                       cudaStream_t stream) {
  return launch(func, gridDim, blockDim, args, sharedMem, stream, false);
}
FAKECUDA_EXPORT cudaError_t CUDARTAPI cudaLaunchKernel_ptsz(const void* func, dim3 gridDim, dim3 blockDim, void** args,
                                                            size_t sharedMem, cudaStream_t stream) {
  return launch(func, gridDim, blockDim, args, sharedMem, stream, true);
}
cudaError_t CUDARTAPI cudaLaunchKernelExC(const cudaLaunchConfig_t* config, const void* func, void** args) {
  return launch_ex(config, func, args, false);
}
FAKECUDA_EXPORT cudaError_t CUDARTAPI cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t* config, const void* func,
                                                               void** args) {
  return launch_ex(config, func, args, true);
}

#ifndef FAKECUDART_WITHOUT_GET_FUNC_BY_SYMBOL
cudaError_t CUDARTAPI cudaGetFuncBySymbol(cudaFunction_t* functionPtr, const void* symbolPtr) {
  if (!functionPtr) return record(cudaErrorInvalidValue);
  Stub stub;
  if (!symbolPtr || !find_stub(symbolPtr, &stub) || !stub.resolvable) return record(cudaErrorInvalidDeviceFunction);
  *functionPtr = stub.function;  // cudaFunction_t is CUfunction (struct CUfunc_st*)
  return cudaSuccess;
}
#endif

// Test helper (fakecuda.h): ties a host stub to a CUfunction; f == NULL removes it.
FAKECUDA_EXPORT int fakecudart_register_stub(const void* stub, CUfunction f, int resolvable) {
  try {
    std::lock_guard lock(g_stub_mutex);
    if (f) stubs()[stub] = Stub{f, resolvable != 0};
    else stubs().erase(stub);
    return 0;
  } catch (...) {
    return -1;
  }
}

cudaError_t CUDARTAPI cudaDriverGetVersion(int* version) {
  if (!version) return record(cudaErrorInvalidValue);
  std::call_once(g_init_once, init);
  if (!g_driver.DriverGetVersion) {
    *version = 0;  // no driver
    return cudaSuccess;
  }
  return record(to_cuda(g_driver.DriverGetVersion(version)));
}

cudaError_t CUDARTAPI cudaRuntimeGetVersion(int* version) {
  if (!version) return record(cudaErrorInvalidValue);
  *version = kVersion;
  return cudaSuccess;
}

}  // extern "C"
