#include "info_command.h"

#include <cuda.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <regex>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "spillway/config.h"
#include "spillway/cupti_library.h"
#include "spillway/policy.h"
#include "spillway/sim/params.h"
#include "spillway/size.h"
#include "policy_registry.h"

namespace spillway::cli {

namespace {

// The driver entry points `info` reads, resolved from libcuda.so.1 by dlsym (the names are
// the ABI versions cuda.h 13.0 maps its macros to).
struct Driver {
  void* handle = nullptr;
  CUresult (*init)(unsigned) = nullptr;
  CUresult (*driver_version)(int*) = nullptr;
  CUresult (*device_count)(int*) = nullptr;
  CUresult (*device_get)(CUdevice*, int) = nullptr;
  CUresult (*device_name)(char*, int, CUdevice) = nullptr;
  CUresult (*total_mem)(size_t*, CUdevice) = nullptr;
  CUresult (*attribute)(int*, CUdevice_attribute, CUdevice) = nullptr;
  CUresult (*ctx_retain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*ctx_release)(CUdevice) = nullptr;
  CUresult (*ctx_set_current)(CUcontext) = nullptr;
  CUresult (*mem_get_info)(size_t*, size_t*) = nullptr;
  CUresult (*get_proc_address)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*) = nullptr;
  CUresult (*error_name)(CUresult, const char**) = nullptr;

  template <typename F>
  bool resolve(F& out, const char* name) {
    out = reinterpret_cast<F>(dlsym(handle, name));
    return out != nullptr;
  }

  std::string error(CUresult r) const {
    const char* name = nullptr;
    if (error_name != nullptr) error_name(r, &name);
    return name != nullptr ? std::string(name) : fmt::format("error {}", static_cast<int>(r));
  }
};

struct Device {
  int ordinal = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  std::uint64_t total_bytes = 0;
  std::optional<std::uint64_t> free_bytes;  // through the primary context
  std::string free_error;                   // why free_bytes is unknown
  bool concurrent_managed_access = false;
  bool discard_batch = false;   // cuMemDiscardBatchAsync (CUDA 13.0)
  bool prefetch_batch = false;  // cuMemPrefetchBatchAsync (CUDA 13.0)
  std::uint64_t budget_bytes = 0;
};

struct Report {
  std::string driver_error;  // non-empty: no usable driver
  std::string kernel_module;  // NVIDIA's kernel module version, "" when unknown
  int cuda_version = 0;       // cuDriverGetVersion: 13000 = 13.0
  std::vector<Device> devices;
};

std::string cuda_text(int version) { return fmt::format("{}.{}", version / 1000, version % 1000 / 10); }

// The version of NVIDIA's kernel module, from /proc/driver/nvidia/version ("NVRM version:
// NVIDIA UNIX ... Kernel Module  580.95.05  ..."), the file nvidia-smi reads it from too.
std::string kernel_module_version() {
  std::ifstream in("/proc/driver/nvidia/version");
  std::string line;
  if (!std::getline(in, line)) return {};
  std::smatch m;
  static const std::regex version(R"((\d+\.\d+(\.\d+)?))");
  const std::size_t at = line.find("Module");
  const std::string rest = at == std::string::npos ? line : line.substr(at);
  return std::regex_search(rest, m, version) ? m[1].str() : std::string();
}

bool entry_point_exists(const Driver& d, const char* name) {
  if (d.get_proc_address == nullptr) return false;
  void* p = nullptr;
  CUdriverProcAddressQueryResult status{};
  return d.get_proc_address(name, &p, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &status) == CUDA_SUCCESS &&
         status == CU_GET_PROC_ADDRESS_SUCCESS && p != nullptr;
}

// Opens libcuda.so.1 and resolves the entry points `info` needs; the error in
// rep.driver_error otherwise.
bool open_driver(Driver& d, Report& rep) {
  d.handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (d.handle == nullptr) {
    const char* why = dlerror();
    rep.driver_error = fmt::format("libcuda.so.1 not found ({})", why != nullptr ? why : "dlopen failed");
    return false;
  }
  d.resolve(d.error_name, "cuGetErrorName");
  d.resolve(d.get_proc_address, "cuGetProcAddress_v2");
  if (!d.resolve(d.init, "cuInit") || !d.resolve(d.driver_version, "cuDriverGetVersion") ||
      !d.resolve(d.device_count, "cuDeviceGetCount") || !d.resolve(d.device_get, "cuDeviceGet") ||
      !d.resolve(d.device_name, "cuDeviceGetName") || !d.resolve(d.total_mem, "cuDeviceTotalMem_v2") ||
      !d.resolve(d.attribute, "cuDeviceGetAttribute") || !d.resolve(d.ctx_retain, "cuDevicePrimaryCtxRetain") ||
      !d.resolve(d.ctx_release, "cuDevicePrimaryCtxRelease_v2") || !d.resolve(d.ctx_set_current, "cuCtxSetCurrent") ||
      !d.resolve(d.mem_get_info, "cuMemGetInfo_v2")) {
    rep.driver_error = "libcuda.so.1 lacks the entry points of CUDA 12 (too old a driver)";
    return false;
  }
  return true;
}

// Free memory needs a context: the primary one, as the program's would be.
void read_free_memory(const Driver& d, CUdevice handle, Device& dev) {
  CUcontext ctx = nullptr;
  if (CUresult r = d.ctx_retain(&ctx, handle); r != CUDA_SUCCESS) {
    dev.free_error = fmt::format("cuDevicePrimaryCtxRetain: {}", d.error(r));
    return;
  }
  size_t free = 0, total = 0;
  CUresult r2 = d.ctx_set_current(ctx);
  if (r2 == CUDA_SUCCESS) r2 = d.mem_get_info(&free, &total);
  if (r2 == CUDA_SUCCESS) dev.free_bytes = free;
  else dev.free_error = fmt::format("cuMemGetInfo: {}", d.error(r2));
  d.ctx_set_current(nullptr);
  d.ctx_release(handle);
}

// Device `handle`'s name, compute capability, memory and managed access.
void read_device(const Driver& d, CUdevice handle, Device& dev) {
  char name[256] = {};
  if (d.device_name(name, sizeof name, handle) == CUDA_SUCCESS) dev.name = name;
  size_t total = 0;
  if (d.total_mem(&total, handle) == CUDA_SUCCESS) dev.total_bytes = total;
  int value = 0;
  if (d.attribute(&value, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, handle) == CUDA_SUCCESS) dev.cc_major = value;
  if (d.attribute(&value, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, handle) == CUDA_SUCCESS) dev.cc_minor = value;
  dev.concurrent_managed_access =
      d.attribute(&value, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, handle) == CUDA_SUCCESS && value != 0;
  read_free_memory(d, handle, dev);
}

Report read_driver(const Config& config) {
  Report rep;
  rep.kernel_module = kernel_module_version();
  Driver d;
  if (!open_driver(d, rep)) return rep;
  d.driver_version(&rep.cuda_version);  // (needs no cuInit)
  if (CUresult r = d.init(0); r == CUDA_ERROR_NO_DEVICE) {
    return rep;  // a driver, and no device it may use (CUDA_VISIBLE_DEVICES, none installed)
  } else if (r != CUDA_SUCCESS) {
    rep.driver_error = fmt::format("cuInit failed: {}", d.error(r));
    return rep;
  }
  int count = 0;
  if (CUresult r = d.device_count(&count); r != CUDA_SUCCESS) {
    rep.driver_error = fmt::format("cuDeviceGetCount failed: {}", d.error(r));
    return rep;
  }
  const bool discard = entry_point_exists(d, "cuMemDiscardBatchAsync");
  const bool prefetch = entry_point_exists(d, "cuMemPrefetchBatchAsync");
  for (int i = 0; i < count; ++i) {
    Device dev;
    dev.ordinal = i;
    CUdevice handle = 0;
    if (d.device_get(&handle, i) != CUDA_SUCCESS) continue;
    read_device(d, handle, dev);
    dev.discard_batch = discard;
    dev.prefetch_batch = prefetch;
    // What the Engine plans for (config.h), from the free memory at start.
    dev.budget_bytes = planned_budget_bytes(config, dev.free_bytes.value_or(dev.total_bytes), dev.total_bytes);
    rep.devices.push_back(std::move(dev));
  }
  return rep;
}

struct Setting {
  std::string variable, value, source;  // source: default, variable or option
};

// The settings as the shim would read them: the environment, then the options over it,
// each applied to `config`. A bad one ends the command: status 2, one line on stderr; 0
// otherwise.
int read_settings(const std::vector<std::pair<std::string, std::string>>& options, Config& config,
                  std::vector<Setting>& settings) {
  for (const OptionInfo& row : option_table()) {
    const std::string variable(row.variable);
    Setting s{variable, std::string(row.default_text), "default"};
    if (const char* v = std::getenv(variable.c_str()); v != nullptr && *v != '\0') s = {variable, v, "variable"};
    for (const auto& [name, value] : options) {
      if (name == variable) s = {variable, value, "option"};
    }
    if (s.source != "default") {
      std::string err = set_option(config, variable, s.value, policy_names());
      if (!err.empty()) {
        std::cerr << "spillway: " << err << (s.source == "variable" ? " (from the environment)" : "") << '\n';
        return 2;
      }
      if (std::string warning = setting_warning(variable, s.value); !warning.empty()) {
        std::cerr << "spillway: warning: " << warning << '\n';
      }
    }
    settings.push_back(std::move(s));
  }
  return 0;
}

// What `info` reports.
struct Facts {
  std::string shim;
  Config config;
  std::vector<Setting> settings;
  Report rep;
  std::uint64_t host = 0;  // host memory
  std::uint64_t cap = 0;   // managed cap
  bool cupti_found = false;
  std::string cupti_path;
  bool links = false;  // the text lists every link profile's figures
};

nlohmann::json device_json(const Device& d) {
  nlohmann::json dj{{"ordinal", d.ordinal},
                    {"name", d.name},
                    {"compute_capability", fmt::format("{}.{}", d.cc_major, d.cc_minor)},
                    {"total_bytes", d.total_bytes},
                    {"concurrent_managed_access", d.concurrent_managed_access},
                    {"discard_batch", d.discard_batch},
                    {"prefetch_batch", d.prefetch_batch},
                    {"budget_bytes", d.budget_bytes},
                    {"managed", d.concurrent_managed_access}};
  if (d.free_bytes) dj["free_bytes"] = *d.free_bytes;
  else dj["free_error"] = d.free_error;
  return dj;
}

// The simulator's link profiles (spillway sweep/replay --link), each figure with its source.
nlohmann::json links_json() {
  nlohmann::json links = nlohmann::json::array();
  auto points = [](const std::vector<sim::CallPoint>& pts) {
    nlohmann::json a = nlohmann::json::array();
    for (const sim::CallPoint& p : pts) a.push_back({{"bytes", p.bytes}, {"measured_gb_per_s", p.gb_per_s}});
    return a;
  };
  for (const sim::LinkProfile& l : sim::link_profiles()) {
    links.push_back({{"name", l.name},
                     {"h2d_bytes_per_s", l.h2d_bytes_per_s},
                     {"d2h_bytes_per_s", l.d2h_bytes_per_s},
                     {"fault_batch_ns", l.fault_batch_ns},
                     {"fault_slowdown", l.fault_slowdown},
                     {"call_shape", {{"h2d", points(l.calls.h2d)}, {"d2h", points(l.calls.d2h)},
                                     {"h2d_batch_share", l.calls.h2d_batch_share}}},
                     {"fastest_call_bytes_per_s", {{"h2d", sim::peak_bytes_per_s(l, Location::gpu)}, {"d2h", sim::peak_bytes_per_s(l, Location::cpu)}}},
                     {"sources", {{"bandwidth", l.sources.bandwidth}, {"calls", l.sources.calls}, {"fault_batch", l.sources.fault_batch},
                                  {"fault_slowdown", l.sources.fault_slowdown}}}});
  }
  return links;
}

// Where launches' extents will come from (docs/configuration.md, "When to use keep").
std::string extents_text(const Facts& f) {
  if (f.config.framework_per_tensor) return "per-tensor mode: every tensor a block of its own (SPILLWAY_FRAMEWORK_ALLOCATOR)";
  return fmt::format("framework allocator kept: PyTorch's allocator trace where torch 2.2 to 2.15 is loaded (checked at run "
                     "time), else {}",
                     f.config.fault_feedback && f.cupti_found ? "fault feedback" : "the argument scan alone");
}

void print_json(const Facts& f) {
  const Report& rep = f.rep;
  nlohmann::json j;
  j["version"] = SPILLWAY_VERSION;
  j["shim"] = f.shim;
  j["built_with_cuda"] = cuda_text(CUDA_VERSION);
  nlohmann::json drv;
  drv["found"] = rep.driver_error.empty();
  if (!rep.driver_error.empty()) drv["error"] = rep.driver_error;
  drv["kernel_module"] = rep.kernel_module;
  drv["cuda"] = rep.cuda_version > 0 ? cuda_text(rep.cuda_version) : "";
  j["driver"] = drv;
  j["host"] = {{"memory_bytes", f.host}, {"managed_cap_bytes", f.cap}};
  j["cupti"] = {{"found", f.cupti_found}, {"path", f.cupti_path}};
  j["extents"] = extents_text(f);
  j["devices"] = nlohmann::json::array();
  for (const Device& d : rep.devices) j["devices"].push_back(device_json(d));
  j["settings"] = nlohmann::json::array();
  for (const Setting& s : f.settings) j["settings"].push_back({{"variable", s.variable}, {"value", s.value}, {"source", s.source}});
  j["links"] = links_json();
  // (Values from the environment need not be UTF-8: such bytes are replaced, not thrown on.)
  std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
}

std::string device_text(const Device& d, const Config& config) {
  std::string out;
  out += fmt::format("device {}   {}, compute {}.{}, {} total, {}\n", d.ordinal, d.name, d.cc_major, d.cc_minor,
                     format_bytes(d.total_bytes),
                     d.free_bytes ? format_bytes(*d.free_bytes) + " free" : "free unknown (" + d.free_error + ")");
  out += fmt::format("           concurrent managed access {}; cuMemDiscardBatchAsync {}; cuMemPrefetchBatchAsync {}\n",
                     d.concurrent_managed_access ? "yes" : "no", d.discard_batch ? "yes" : "no",
                     d.prefetch_batch ? "yes" : "no");
  if (d.concurrent_managed_access) {
    out += fmt::format("           budget {} (SPILLWAY_BUDGET), policy {}\n", format_bytes(d.budget_bytes), config.policy);
  } else {
    out += "           allocations pass through: no concurrent managed access (WSL2, Windows or a pre-Pascal GPU)\n";
  }
  return out;
}

void print_text(const Facts& f) {
  const Report& rep = f.rep;
  std::string out;
  out += fmt::format("spillway {}   shim {}\n", SPILLWAY_VERSION, f.shim.empty() ? "not found next to this program" : f.shim);
  if (rep.driver_error.empty()) {
    out += fmt::format("driver     {}CUDA {} (Spillway built with CUDA {})\n",
                       rep.kernel_module.empty() ? "" : "NVIDIA " + rep.kernel_module + ", ", cuda_text(rep.cuda_version),
                       cuda_text(CUDA_VERSION));
  } else {
    out += fmt::format("driver     none: {}\n", rep.driver_error);
  }
  out += fmt::format("host       {} of memory; managed cap {} (SPILLWAY_MAX_MANAGED)\n", format_bytes(f.host), format_bytes(f.cap));
  out += fmt::format("CUPTI      {}\n", f.cupti_found ? f.cupti_path
                                                      : std::string("not found (") + kCuptiSearchText + "): no fault feedback");
  out += fmt::format("extents    {}\n", extents_text(f));
  if (rep.driver_error.empty() && rep.devices.empty()) out += "devices    none\n";
  for (const Device& d : rep.devices) out += device_text(d, f.config);
  out += "settings   (source: default, variable = the environment, option = given here)\n";
  for (const Setting& s : f.settings) out += fmt::format("  {:<29} {:<24} {}\n", s.variable, s.value.empty() ? "(none)" : s.value, s.source);
  std::string names;
  for (const sim::LinkProfile& l : sim::link_profiles()) names += (names.empty() ? "" : ", ") + l.name;
  out += fmt::format("simulator  link profiles {} (spillway sweep/replay --link); spillway info --links: each figure with its source\n", names);
  if (f.links) {
    for (const sim::LinkProfile& l : sim::link_profiles()) out += sim::describe_link(l, l.fault_slowdown);
  }
  std::cout << out;
}

}  // namespace

int info_command(const std::vector<std::pair<std::string, std::string>>& options, const std::string& shim, bool json,
                 bool links) {
  Facts f;
  f.shim = shim;
  f.links = links;
  if (int status = read_settings(options, f.config, f.settings); status != 0) return status;
  f.rep = read_driver(f.config);
  f.host = read_host_memory_bytes();
  f.cap = managed_cap_bytes(f.config, f.host);
  void* cupti = open_cupti_library(&f.cupti_path);
  f.cupti_found = cupti != nullptr;
  if (cupti != nullptr && f.cupti_path.empty()) f.cupti_path = "(loaded)";
  if (json) print_json(f);
  else print_text(f);
  return 0;
}

}  // namespace spillway::cli
