// Kernel information (kernel_info.h): a lock-free cache per handle, read through the driver's
// parameter-info and name calls.
#include "kernel_info.h"

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <mutex>
#include <unordered_map>

#include "driver_helpers.h"
#include "shim.h"
#include "spillway/log.h"

namespace spillway::interpose {
namespace {

constexpr std::size_t kMaxParams = 1024;

// The code generation (kernel_info.h): bumped by every call that may unload code.
std::atomic<std::uint64_t> g_code_generation{0};

// Lock-free read path: a fixed open-addressing table of atomic pointers; insertion by CAS.
// Past kSlots entries (never in practice) a mutex-guarded map takes over. An entry of an
// older code generation is replaced in its slot by a fresh one (the old one is retired).
class FuncCache {
 public:
  template <typename Make>
  const FuncInfo* get(const void* key, Make&& make) {
    const std::uint64_t gen = g_code_generation.load(std::memory_order_acquire);
    std::size_t h = slot_of(key);
    for (std::size_t i = 0; i < kProbe; ++i) {
      std::atomic<FuncInfo*>& slot = slots_[(h + i) & (kSlots - 1)];
      FuncInfo* cur = slot.load(std::memory_order_acquire);
      if (cur != nullptr && cur->key != key) continue;
      if (cur != nullptr && cur->generation == gen) return cur;
      // Empty, or this key's entry of an older generation: read the function now.
      FuncInfo* fresh = make(key);
      fresh->generation = gen;
      FuncInfo* expected = cur;
      if (slot.compare_exchange_strong(expected, fresh, std::memory_order_acq_rel)) return fresh;  // (cur retired)
      delete fresh;
      if (expected->key == key) return expected;  // another thread read it first
    }
    std::lock_guard lock(overflow_mutex_);
    auto it = overflow_.find(key);
    if (it != overflow_.end() && it->second->generation == gen) return it->second;
    FuncInfo* fresh = make(key);
    fresh->generation = gen;
    overflow_[key] = fresh;  // (an older entry is retired)
    return fresh;
  }

 private:
  static constexpr std::size_t kSlots = 8192, kProbe = 32;
  static std::size_t slot_of(const void* p) {
    return static_cast<std::size_t>((reinterpret_cast<std::uintptr_t>(p) >> 4) * 0x9e3779b97f4a7c15ull >> 51);
  }
  std::array<std::atomic<FuncInfo*>, kSlots> slots_{};
  std::mutex overflow_mutex_;
  std::unordered_map<const void*, FuncInfo*> overflow_;
};

FuncCache& functions() {
  static auto* cache = new FuncCache();  // never destroyed: hooks may run during exit
  return *cache;
}

std::atomic<std::uint64_t> g_unnamed{0};

using FuncGetNameFn = CUresult (*)(const char**, CUfunction);
FuncGetNameFn func_get_name() {
  static FuncGetNameFn fn = optional_driver_fn<FuncGetNameFn>("cuFuncGetName", 12030);
  return fn;
}

// The CUDA runtime (12+) loads kernels as context-independent CUkernel handles (cuLibrary*)
// and passes them to cuLaunchKernel, which accepts both kinds ("CUDA Driver API: Library
// Management"); cuFuncGetParamInfo/cuFuncGetName answer CUDA_ERROR_INVALID_HANDLE for a
// CUkernel, cuKernelGetParamInfo (12.4) and cuKernelGetName (12.3) answer instead.
using ParamInfoFn = CUresult (*)(CUfunction, size_t, size_t*, size_t*);
ParamInfoFn kernel_get_param_info() {
  static ParamInfoFn fn = optional_driver_fn<ParamInfoFn>("cuKernelGetParamInfo", 12040);
  return fn;
}
FuncGetNameFn kernel_get_name() {
  static FuncGetNameFn fn = optional_driver_fn<FuncGetNameFn>("cuKernelGetName", 12030);
  return fn;
}

FuncInfo* make_info(const void* key, CUfunction f) {
  auto* info = new FuncInfo();
  info->key = key;
  info->function = f;
  ShimCallScope scope;
  ParamInfoFn param_info = real().cuFuncGetParamInfo;
  bool is_kernel = false;
  if (f != nullptr && param_info != nullptr) {
    size_t offset = 0, size = 0;
    if (param_info(f, 0, &offset, &size) == CUDA_ERROR_INVALID_HANDLE && kernel_get_param_info() != nullptr) {
      param_info = kernel_get_param_info();
      is_kernel = true;
    }
  }
  if (f != nullptr && param_info != nullptr) {
    for (std::size_t i = 0; i < kMaxParams; ++i) {
      size_t offset = 0, size = 0;
      CUresult r = param_info(f, i, &offset, &size);
      if (r != CUDA_SUCCESS && i == 0 && r != CUDA_ERROR_INVALID_VALUE) {
        SPILLWAY_LOG_ONCE(LogLevel::debug, "launches: cuFuncGetParamInfo failed ({}); footprints unknown", static_cast<int>(r));
      }
      if (r != CUDA_SUCCESS) {
        info->layout_known = i > 0 || r == CUDA_ERROR_INVALID_VALUE;
        break;
      }
      info->buffer_bytes = std::max<std::uint32_t>(info->buffer_bytes, static_cast<std::uint32_t>(offset + size));
      if (size >= 8) {
        info->params.push_back(FuncInfo::Param{static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(offset),
                                               static_cast<std::uint32_t>(size)});
      }
    }
  }
  if (f != nullptr) {
    if (FuncGetNameFn get = is_kernel ? kernel_get_name() : func_get_name()) {
      const char* n = nullptr;
      if (get(&n, f) == CUDA_SUCCESS && n != nullptr) info->name = n;
    }
  }
  if (info->name.empty()) info->name = "kernel" + std::to_string(g_unnamed.fetch_add(1));
  return info;
}

}  // namespace

const FuncInfo* info_for(CUfunction f) {
  return functions().get(f, [f](const void* key) { return make_info(key, f); });
}

namespace {

using GetFuncBySymbolFn = cudaError_t (*)(cudaFunction_t*, const void*);

FuncCache& stubs() {
  static auto* cache = new FuncCache();
  return *cache;
}

// cudaGetFuncBySymbol from the very libcudart whose cudaLaunchKernel the program calls.
// Frameworks load that runtime into a local scope (Python extensions are dlopen'ed
// RTLD_LOCAL), where RTLD_DEFAULT does not reach: open the object that holds the real
// cudaLaunchKernel instead.
GetFuncBySymbolFn runtime_get_func_by_symbol() {
  void* anchor = reinterpret_cast<void*>(real().cudaLaunchKernel);
  Dl_info info{};
  if (anchor == nullptr || dladdr(anchor, &info) == 0 || info.dli_fname == nullptr) return nullptr;
  void* handle = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (handle == nullptr) return nullptr;
  auto fn = reinterpret_cast<GetFuncBySymbolFn>(dlsym(handle, "cudaGetFuncBySymbol"));
  dlclose(handle);  // NOLOAD took a reference to an object that stays loaded
  log(LogLevel::debug, "runtime launches: cudaGetFuncBySymbol {} in {}", fn != nullptr ? "found" : "missing",
      info.dli_fname);
  return fn;
}

}  // namespace

const FuncInfo* stub_info(const void* stub) {
  const FuncInfo* s = stubs().get(stub, [](const void* key) {
    static GetFuncBySymbolFn get = runtime_get_func_by_symbol();
    cudaFunction_t f = nullptr;
    if (get != nullptr) {
      ShimCallScope scope;
      if (cudaError_t r = get(&f, key); r != cudaSuccess) {
        SPILLWAY_LOG_ONCE(LogLevel::debug, "runtime launches: cudaGetFuncBySymbol failed ({}) for a host stub", static_cast<int>(r));
        f = nullptr;
      }
    }
    if (f == nullptr) return make_info(key, nullptr);
    auto* link = new FuncInfo();
    link->key = key;
    link->function = reinterpret_cast<CUfunction>(f);
    return link;
  });
  return s->function != nullptr ? info_for(s->function) : s;
}

void note_code_unloading() { g_code_generation.fetch_add(1, std::memory_order_acq_rel); }

}  // namespace spillway::interpose
