// What the launch hooks know of a kernel: its parameter layout and name, read once per
// handle and code generation (hooks_launch.cpp, file comment, step 1). Not a public interface.
//
// A handle names one kernel only while its code is loaded: after cuModuleUnload,
// cuLibraryUnload or the end of a context (cuCtxDestroy, cuDevicePrimaryCtxRelease/Reset) the
// driver may hand the very same CUfunction/CUkernel to another kernel. Each of those calls
// starts a new code generation (note_code_unloading); an entry of an older generation is read
// again before it is used. Entries are never freed (a launch on another thread may still be
// reading a retired one; one per function per unload).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <string>
#include <vector>

namespace spillway::interpose {

struct FuncInfo {
  const void* key = nullptr;     // the CUfunction, or the runtime's host stub
  std::uint64_t generation = 0;  // the code generation it was read in
  CUfunction function = nullptr;
  bool layout_known = false;  // cuFuncGetParamInfo / cuKernelGetParamInfo answered
  struct Param {
    std::uint32_t index, offset, size;  // offset, size: bytes
  };
  std::vector<Param> params;       // parameters of 8 bytes or more (the only ones that can hold a pointer)
  std::uint32_t buffer_bytes = 0;  // end of the last parameter, bytes
  std::string name;                // cuFuncGetName / cuKernelGetName, else "kernelN"
};

// The information of `f` (a CUfunction or a CUkernel: the CUDA runtime 12+ passes
// context-independent CUkernel handles to cuLaunchKernel; CUDA Driver API, "Library
// Management"). Never null. Lock-free after the first read of `f` in this generation.
// Thread-safe.
const FuncInfo* info_for(CUfunction f);
// The information of a runtime host stub (cudaLaunchKernel's `func`): its CUfunction's
// (cudaGetFuncBySymbol of the libcudart the program calls), or one without a layout when the
// runtime cannot say. Never null. Thread-safe.
const FuncInfo* stub_info(const void* stub);
// Code may be unloaded now (cuModuleUnload, cuLibraryUnload, the end of a context): call
// before the real call, so that no launch after it returns reads an entry of that code.
// Thread-safe.
void note_code_unloading();

}  // namespace spillway::interpose
