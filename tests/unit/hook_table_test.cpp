// interpose/hooks.def, the one list of hooks, checked three ways:
//  - at compile time, each driver row's signature is the one cuda.h (CUDA 13.0) declares for
//    that exact versioned symbol;
//  - libspillway.so exports a hook for every hooked row;
//  - the `since` and `variant` of each driver row are what a driver's cuGetProcAddress_v2
//    answers: (base, since, flags) resolves to exactly `symbol`, and (base, since - 1) does not.
#define __CUDA_API_VERSION_INTERNAL 1  // declare every versioned name (_v2, _ptsz, v1 ABIs)
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <dlfcn.h>

#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#undef cuGetProcAddress

// --- compile time: hooks.def signatures == cuda.h ------------------------------------
#define SPILLWAY_DRIVER_HOOK(symbol, base, since, variant, ret, params, args) \
  static_assert(std::is_same_v<decltype(&::symbol), ret(*) params>, #symbol ": hooks.def signature differs from cuda.h");
#define SPILLWAY_DRIVER_USE(symbol, ret, params) \
  static_assert(std::is_same_v<decltype(&::symbol), ret(*) params>, #symbol ": hooks.def signature differs from cuda.h");
#include "hooks.def"

namespace {

struct Row {
  std::string symbol, base;
  int since;
  bool ptsz;
  enum Kind { driver_hook, runtime_hook, driver_use } kind;
};

std::vector<Row> rows() {
  std::vector<Row> r;
  const bool plain = false, ptsz = true;
  (void)plain, (void)ptsz;
#define SPILLWAY_DRIVER_HOOK(symbol, base, since, variant, ret, params, args) \
  r.push_back(Row{#symbol, #base, since, variant, Row::driver_hook});
#define SPILLWAY_RUNTIME_HOOK(symbol, ret, params, args) r.push_back(Row{#symbol, #symbol, 0, false, Row::runtime_hook});
#define SPILLWAY_DRIVER_USE(symbol, ret, params) r.push_back(Row{#symbol, #symbol, 0, false, Row::driver_use});
#include "hooks.def"
  return r;
}

std::string symbol_name(void* p) {
  Dl_info info{};
  if (p == nullptr || dladdr(p, &info) == 0 || info.dli_sname == nullptr) return "(none)";
  return info.dli_sname;
}

TEST(HookTable, NoDuplicateRows) {
  std::set<std::string> seen;
  for (const Row& r : rows()) EXPECT_TRUE(seen.insert(r.symbol).second) << r.symbol << " listed twice";
  EXPECT_GE(seen.size(), 20u);
}

TEST(HookTable, ShimExportsEveryHook) {
  void* shim = dlopen(SPILLWAY_SHIM_PATH, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(shim, nullptr) << dlerror();
  Dl_info self{};
  ASSERT_NE(dladdr(dlsym(shim, "cuMemAlloc_v2"), &self), 0);
  int hooks = 0;
  for (const Row& r : rows()) {
    if (r.kind == Row::driver_use) continue;
    ++hooks;
    void* p = dlsym(shim, r.symbol.c_str());
    ASSERT_NE(p, nullptr) << r.symbol << " is not exported by libspillway.so";
    Dl_info info{};
    ASSERT_NE(dladdr(p, &info), 0);
    EXPECT_EQ(info.dli_fbase, self.dli_fbase) << r.symbol << " resolves outside libspillway.so";
    EXPECT_EQ(symbol_name(p), r.symbol);
  }
  EXPECT_GE(hooks, 20);
  void* d = dlsym(shim, "dlsym");
  ASSERT_NE(d, nullptr) << "the shim exports dlsym";
  Dl_info info{};
  ASSERT_NE(dladdr(d, &info), 0);
  EXPECT_EQ(info.dli_fbase, self.dli_fbase);
}

TEST(HookTable, DriverRowsMatchWhatCuGetProcAddressAnswers) {
  void* drv = dlopen(FAKECUDA_DRIVER_PATH, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(drv, nullptr) << dlerror();
  auto gpa = reinterpret_cast<decltype(&cuGetProcAddress_v2)>(dlsym(drv, "cuGetProcAddress_v2"));
  ASSERT_NE(gpa, nullptr);
  for (const Row& r : rows()) {
    if (r.kind != Row::driver_hook) continue;
    cuuint64_t flags = r.ptsz ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : CU_GET_PROC_ADDRESS_LEGACY_STREAM;
    void* fn = nullptr;
    CUdriverProcAddressQueryResult status{};
    ASSERT_EQ(gpa(r.base.c_str(), &fn, r.since, flags, &status), CUDA_SUCCESS) << r.base << "@" << r.since;
    EXPECT_EQ(symbol_name(fn), r.symbol) << r.base << "@" << r.since << (r.ptsz ? " per-thread" : "");
    EXPECT_EQ(fn, dlsym(drv, r.symbol.c_str())) << r.symbol;
    void* older = nullptr;
    gpa(r.base.c_str(), &older, r.since - 1, flags, &status);
    EXPECT_NE(symbol_name(older), r.symbol) << r.symbol << ": `since` " << r.since << " is not the first version";
  }
}

TEST(HookTable, DriverFunctionsTheShimUsesExist) {
  void* drv = dlopen(FAKECUDA_DRIVER_PATH, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(drv, nullptr) << dlerror();
  for (const Row& r : rows()) {
    if (r.kind == Row::runtime_hook) continue;
    EXPECT_NE(dlsym(drv, r.symbol.c_str()), nullptr) << r.symbol;
  }
}

}  // namespace
