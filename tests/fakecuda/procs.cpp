// fakecuda cuGetProcAddress / cuGetProcAddress_v2: maps (base name, cudaVersion, flags) to
// one of the exported symbols, as the real driver does for the runtime.
// Source of the table: cuda.h (CUDA 13.0) — the "#define cuX cuX_v2" lines give the current
// symbol, __CUDA_API_PTSZ(...) marks per-thread-stream variants, and the typedefs in
// cudaTypedefs.h (PFN_cuX_v<version>) give the version each ABI appeared in. Only symbols
// this fake exports are listed; a base name whose older ABI is not faked starts at the
// version of the oldest faked one.
#include <cstring>

#include "core.h"

using namespace fakecuda;

namespace {

struct Proc {
  const char* base;
  int version;  // first cudaVersion that gets this symbol
  void* fn;
  void* ptsz;   // per-thread default stream variant, or nullptr
};

template <class F>
void* fp(F* f) {
  return reinterpret_cast<void*>(f);
}

#define P(base, version, fn) {#base, version, fp(&fn), nullptr}
#define PT(base, version, fn, ptsz) {#base, version, fp(&fn), fp(&ptsz)}

const Proc kProcs[] = {
    P(cuInit, 2000, cuInit),
    P(cuDriverGetVersion, 2020, cuDriverGetVersion),
    P(cuDeviceGet, 2000, cuDeviceGet),
    P(cuDeviceGetCount, 2000, cuDeviceGetCount),
    P(cuDeviceGetName, 2000, cuDeviceGetName),
    P(cuDeviceGetAttribute, 2000, cuDeviceGetAttribute),
    P(cuDeviceTotalMem, 3020, cuDeviceTotalMem_v2),
    P(cuDeviceGetUuid, 9020, cuDeviceGetUuid),
    P(cuDeviceGetUuid, 11040, cuDeviceGetUuid_v2),
    P(cuDeviceGetPCIBusId, 4010, cuDeviceGetPCIBusId),
    P(cuDeviceGetByPCIBusId, 4010, cuDeviceGetByPCIBusId),
    P(cuDevicePrimaryCtxRetain, 7000, cuDevicePrimaryCtxRetain),
    P(cuDevicePrimaryCtxRelease, 11000, cuDevicePrimaryCtxRelease_v2),
    P(cuDevicePrimaryCtxReset, 11000, cuDevicePrimaryCtxReset_v2),
    P(cuDevicePrimaryCtxGetState, 7000, cuDevicePrimaryCtxGetState),
    P(cuDevicePrimaryCtxSetFlags, 7000, cuDevicePrimaryCtxSetFlags),
    P(cuDevicePrimaryCtxSetFlags, 11000, cuDevicePrimaryCtxSetFlags_v2),
    P(cuCtxCreate, 3020, cuCtxCreate_v2),
    P(cuCtxCreate, 11040, cuCtxCreate_v3),
    P(cuCtxCreate, 12050, cuCtxCreate_v4),
    P(cuCtxDestroy, 4000, cuCtxDestroy_v2),
    P(cuCtxGetCurrent, 4000, cuCtxGetCurrent),
    P(cuCtxSetCurrent, 4000, cuCtxSetCurrent),
    P(cuCtxPushCurrent, 4000, cuCtxPushCurrent_v2),
    P(cuCtxPopCurrent, 4000, cuCtxPopCurrent_v2),
    P(cuCtxGetDevice, 2000, cuCtxGetDevice),
    P(cuCtxGetDevice, 13000, cuCtxGetDevice_v2),
    P(cuCtxSynchronize, 2000, cuCtxSynchronize),
    P(cuMemAlloc, 2000, cuMemAlloc),
    P(cuMemAlloc, 3020, cuMemAlloc_v2),
    P(cuMemAllocPitch, 3020, cuMemAllocPitch_v2),
    P(cuMemAllocManaged, 6000, cuMemAllocManaged),
    PT(cuMemAllocAsync, 11020, cuMemAllocAsync, cuMemAllocAsync_ptsz),
    PT(cuMemAllocFromPoolAsync, 11020, cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz),
    P(cuDeviceGetDefaultMemPool, 11020, cuDeviceGetDefaultMemPool),
    P(cuDeviceGetMemPool, 11020, cuDeviceGetMemPool),
    P(cuDeviceSetMemPool, 11020, cuDeviceSetMemPool),
    P(cuMemPoolCreate, 11020, cuMemPoolCreate),
    P(cuMemPoolDestroy, 11020, cuMemPoolDestroy),
    P(cuMemFree, 2000, cuMemFree),
    P(cuMemFree, 3020, cuMemFree_v2),
    PT(cuMemFreeAsync, 11020, cuMemFreeAsync, cuMemFreeAsync_ptsz),
    P(cuMemGetInfo, 2000, cuMemGetInfo),
    P(cuMemGetInfo, 3020, cuMemGetInfo_v2),
    P(cuMemGetAddressRange, 3020, cuMemGetAddressRange_v2),
    P(cuMemHostAlloc, 2020, cuMemHostAlloc),
    P(cuMemAllocHost, 3020, cuMemAllocHost_v2),
    P(cuMemFreeHost, 2000, cuMemFreeHost),
    P(cuPointerGetAttribute, 4000, cuPointerGetAttribute),
    P(cuPointerGetAttributes, 7000, cuPointerGetAttributes),
    PT(cuMemPrefetchAsync, 8000, cuMemPrefetchAsync, cuMemPrefetchAsync_ptsz),
    PT(cuMemPrefetchAsync, 12020, cuMemPrefetchAsync_v2, cuMemPrefetchAsync_v2_ptsz),
    PT(cuMemDiscardBatchAsync, 13000, cuMemDiscardBatchAsync, cuMemDiscardBatchAsync_ptsz),
    PT(cuMemPrefetchBatchAsync, 13000, cuMemPrefetchBatchAsync, cuMemPrefetchBatchAsync_ptsz),
    P(cuMemAdvise, 8000, cuMemAdvise),
    P(cuMemAdvise, 12020, cuMemAdvise_v2),
    P(cuMemcpyHtoD, 3020, cuMemcpyHtoD_v2),  // _v2_ptds variants are not faked
    P(cuMemcpyDtoH, 3020, cuMemcpyDtoH_v2),
    P(cuMemcpyDtoD, 3020, cuMemcpyDtoD_v2),
    P(cuMemcpy, 4000, cuMemcpy),
    PT(cuMemcpyAsync, 4000, cuMemcpyAsync, cuMemcpyAsync_ptsz),
    P(cuMemsetD8, 3020, cuMemsetD8_v2),
    P(cuMemsetD32, 3020, cuMemsetD32_v2),
    P(cuStreamCreate, 2000, cuStreamCreate),
    P(cuStreamCreateWithPriority, 5050, cuStreamCreateWithPriority),
    P(cuStreamDestroy, 4000, cuStreamDestroy_v2),
    PT(cuStreamSynchronize, 2000, cuStreamSynchronize, cuStreamSynchronize_ptsz),
    PT(cuStreamQuery, 2000, cuStreamQuery, cuStreamQuery_ptsz),
    PT(cuStreamWaitEvent, 3020, cuStreamWaitEvent, cuStreamWaitEvent_ptsz),
    PT(cuStreamGetCtx, 9020, cuStreamGetCtx, cuStreamGetCtx_ptsz),
    PT(cuStreamGetCtx, 12050, cuStreamGetCtx_v2, cuStreamGetCtx_v2_ptsz),
    PT(cuStreamGetDevice, 12080, cuStreamGetDevice, cuStreamGetDevice_ptsz),
    PT(cuStreamIsCapturing, 10000, cuStreamIsCapturing, cuStreamIsCapturing_ptsz),
    PT(cuStreamGetCaptureInfo, 12030, cuStreamGetCaptureInfo_v3, cuStreamGetCaptureInfo_v3_ptsz),
    PT(cuStreamBeginCapture, 10010, cuStreamBeginCapture_v2, cuStreamBeginCapture_v2_ptsz),
    PT(cuStreamBeginCaptureToGraph, 12030, cuStreamBeginCaptureToGraph, cuStreamBeginCaptureToGraph_ptsz),
    PT(cuStreamEndCapture, 10000, cuStreamEndCapture, cuStreamEndCapture_ptsz),
    P(cuThreadExchangeStreamCaptureMode, 10010, cuThreadExchangeStreamCaptureMode),
    P(cuEventCreate, 2000, cuEventCreate),
    PT(cuEventRecord, 2000, cuEventRecord, cuEventRecord_ptsz),
    P(cuEventQuery, 2000, cuEventQuery),
    P(cuEventSynchronize, 2000, cuEventSynchronize),
    P(cuEventDestroy, 4000, cuEventDestroy_v2),
    P(cuEventElapsedTime, 2000, cuEventElapsedTime),
    P(cuEventElapsedTime, 12080, cuEventElapsedTime_v2),
    P(cuModuleLoadData, 2000, cuModuleLoadData),
    P(cuModuleGetFunction, 2000, cuModuleGetFunction),
    P(cuModuleUnload, 2000, cuModuleUnload),
    P(cuLibraryLoadData, 12000, cuLibraryLoadData),
    P(cuLibraryGetKernel, 12000, cuLibraryGetKernel),
    P(cuLibraryUnload, 12000, cuLibraryUnload),
    P(cuFuncGetParamInfo, 12040, cuFuncGetParamInfo),
    PT(cuLaunchKernel, 4000, cuLaunchKernel, cuLaunchKernel_ptsz),
    PT(cuLaunchKernelEx, 11060, cuLaunchKernelEx, cuLaunchKernelEx_ptsz),
    PT(cuLaunchCooperativeKernel, 9000, cuLaunchCooperativeKernel, cuLaunchCooperativeKernel_ptsz),
    PT(cuGraphLaunch, 10000, cuGraphLaunch, cuGraphLaunch_ptsz),
    P(cuGraphDestroy, 10000, cuGraphDestroy),
    P(cuGraphInstantiateWithFlags, 11040, cuGraphInstantiateWithFlags),
    P(cuGraphExecDestroy, 10000, cuGraphExecDestroy),
    P(cuIpcGetMemHandle, 4010, cuIpcGetMemHandle),
    P(cuMemCreate, 10020, cuMemCreate),
    P(cuMemRelease, 10020, cuMemRelease),
    P(cuMemAddressReserve, 10020, cuMemAddressReserve),
    P(cuMemAddressFree, 10020, cuMemAddressFree),
    P(cuMemMap, 10020, cuMemMap),
    P(cuMemUnmap, 10020, cuMemUnmap),
    P(cuMemSetAccess, 10020, cuMemSetAccess),
    P(cuGetErrorString, 6000, cuGetErrorString),
    P(cuGetErrorName, 6000, cuGetErrorName),
    P(cuGetExportTable, 3000, cuGetExportTable),
    P(cuGetProcAddress, 11030, cuGetProcAddress),
    P(cuGetProcAddress, 12000, cuGetProcAddress_v2),
};

#undef P
#undef PT

CUdriverProcAddressQueryResult lookup(const char* symbol, int version, cuuint64_t flags, void** pfn) {
  const Proc* best = nullptr;
  bool known = false;
  for (const Proc& p : kProcs) {
    if (std::strcmp(p.base, symbol) != 0) continue;
    known = true;
    if (p.version <= version && (!best || p.version > best->version)) best = &p;
  }
  *pfn = nullptr;
  if (!known) return CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  if (!best) return CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
  bool per_thread = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  *pfn = per_thread && best->ptsz ? best->ptsz : best->fn;
  return CU_GET_PROC_ADDRESS_SUCCESS;
}

CUresult get_proc(Call& c, const char* symbol, void** pfn, int version, cuuint64_t flags,
                  CUdriverProcAddressQueryResult* status) {
  c.str("symbol", symbol).sdec("version", version).dec("flags", flags);
  FC_CHECK(c);
  if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
  if (flags & ~cuuint64_t{CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM})
    return CUDA_ERROR_INVALID_VALUE;
  CUdriverProcAddressQueryResult result = lookup(symbol, version, flags, pfn);
  if (status) *status = result;
  c.ptr("pfn", *pfn).sdec("status", result);
  return result == CU_GET_PROC_ADDRESS_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

}  // namespace

extern "C" {

CUresult CUDAAPI cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                                     CUdriverProcAddressQueryResult* status) {
  return api("cuGetProcAddress_v2", "cuGetProcAddress", kNoInit,
             [&](Call& c) { return get_proc(c, symbol, pfn, cudaVersion, flags, status); });
}

// The CUDA 11.3 ABI: no status argument.
CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  return api("cuGetProcAddress", "cuGetProcAddress", kNoInit,
             [&](Call& c) { return get_proc(c, symbol, pfn, cudaVersion, flags, nullptr); });
}

}  // extern "C"
