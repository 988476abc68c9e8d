#include "torch_tracker.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <regex>
#include <span>
#include <sstream>
#include <string_view>
#include <vector>

#include "shim.h"
#include "spillway/engine.h"
#include "spillway/log.h"

namespace spillway::interpose {

namespace {

// Read from each version's headers by scripts/torch-trace-abi, and checked by it against the
// native allocator's vtable in that version's libc10_cuda.so (docs/design.md).
constexpr std::array<TorchTraceLayout, 14> kLayouts{{
    {2, 2, 208, 64, false},  {2, 3, 224, 80, false},  {2, 4, 224, 80, false},  {2, 5, 240, 80, false},
    {2, 6, 280, 80, false},  {2, 7, 280, 80, false},  {2, 8, 304, 80, true},   {2, 9, 312, 48, true},
    {2, 10, 352, 48, true},  {2, 11, 352, 48, true},  {2, 12, 368, 48, true},  {2, 13, 384, 48, true},
    {2, 14, 400, 48, true},  {2, 15, 400, 48, true},
}};

constexpr const char* kAllocatorSymbol = "_ZN3c104cuda20CUDACachingAllocator9allocatorE";
// (libstdc++'s std::function of a const reference: the TraceEntry's namespace changes at 2.11.)
constexpr std::string_view kNativeAttach =
    "_ZN3c104cuda20CUDACachingAllocator6Native22NativeCachingAllocator27attachAllocatorTraceTrackerESt8functionIFvRKN";
constexpr std::string_view kNativeInitialized = "_ZN3c104cuda20CUDACachingAllocator6Native22NativeCachingAllocator11initializedEv";
constexpr std::string_view kNativeVtable = "_ZTVN3c104cuda20CUDACachingAllocator6Native22NativeCachingAllocatorE";
constexpr int kMaxTries = 64;  // allocations and launches that may find PyTorch absent or not initialized yet

// TraceEntry::Action (c10/cuda/CUDACachingAllocator.h; the same values in 2.0-2.15).
enum Action : std::int32_t { kAlloc = 0, kFreeRequested = 1, kFreeCompleted = 2, kSegmentAlloc = 3, kSegmentFree = 4 };

struct TorchTraceEntry;  // PyTorch's TraceEntry, read as bytes at the layout's offsets
using Tracker = std::function<void(const TorchTraceEntry&)>;

std::atomic<int> g_state{0};  // 0 trying, 1 attached, 2 refused
std::atomic<Engine*> g_engine{nullptr};
std::mutex g_mutex;           // one attempt at a time; guards g_tries and g_why
int g_tries = 0;
// Never destroyed: the exit report reads it from a library destructor, after static
// destructors may have run (a shim loaded by dlopen).
std::string& g_why = *new std::string("off: not tried yet");

template <typename T>
T read_at(const TorchTraceEntry& e, std::size_t offset) {
  T v;
  std::memcpy(&v, reinterpret_cast<const unsigned char*>(&e) + offset, sizeof(T));
  return v;
}

// One event of the trace, inside PyTorch's allocator (under its lock).
void on_event(const TorchTraceEntry& e) noexcept {
  Engine* engine = g_engine.load(std::memory_order_acquire);
  if (engine == nullptr) return;
  const auto action = read_at<std::int32_t>(e, 0);
  const auto addr = read_at<std::uint64_t>(e, 8);
  const auto size = read_at<std::uint64_t>(e, 40);
  switch (action) {
    case kSegmentAlloc: engine->follow_segment(addr, size); break;
    case kSegmentFree: engine->unfollow_segment(addr, size); break;
    case kAlloc: engine->note_tensor_alloc(addr, size); break;
    case kFreeCompleted: engine->note_tensor_free(addr); break;
    default: break;  // FREE_REQUESTED (the block is not back yet), SEGMENT_MAP/UNMAP (VMM), SNAPSHOT, OOM
  }
}

// A file mapped read-only.
struct Mapped {
  const unsigned char* base = nullptr;
  std::uint64_t size = 0;
  bool holds(std::uint64_t offset, std::uint64_t bytes) const { return offset <= size && bytes <= size - offset; }
};

// The section headers of a well-formed ELF64 file; empty otherwise.
std::span<const Elf64_Shdr> section_headers(const Mapped& f) {
  if (f.size < sizeof(Elf64_Ehdr)) return {};
  const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(f.base);
  if (std::memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != ELFCLASS64 ||
      eh->e_shentsize != sizeof(Elf64_Shdr) || !f.holds(eh->e_shoff, std::uint64_t(eh->e_shnum) * sizeof(Elf64_Shdr))) {
    return {};
  }
  return {reinterpret_cast<const Elf64_Shdr*>(f.base + eh->e_shoff), eh->e_shnum};
}

struct Symbol {
  std::uint64_t value = 0;
  std::uint64_t size = 0;
};

// The first symbol of `symtab` whose name (in `strtab`) starts with `prefix` and holds no '.'
// (a compiler's split-off part, `.cold` or `.part.0`, is another address).
std::optional<Symbol> find_symbol(const Mapped& f, const Elf64_Shdr& symtab, const Elf64_Shdr& strtab,
                                  std::string_view prefix) {
  if (!f.holds(symtab.sh_offset, symtab.sh_size) || !f.holds(strtab.sh_offset, strtab.sh_size)) return std::nullopt;
  const auto* syms = reinterpret_cast<const Elf64_Sym*>(f.base + symtab.sh_offset);
  const char* names = reinterpret_cast<const char*>(f.base + strtab.sh_offset);
  for (std::uint64_t i = 0; i < symtab.sh_size / sizeof(Elf64_Sym); ++i) {
    if (syms[i].st_name >= strtab.sh_size || syms[i].st_value == 0) continue;
    const char* text = names + syms[i].st_name;
    const std::string_view name(text, strnlen(text, strtab.sh_size - syms[i].st_name));
    if (name.starts_with(prefix) && name.find('.') == std::string_view::npos) return Symbol{syms[i].st_value, syms[i].st_size};
  }
  return std::nullopt;
}

// The symbol of `file` whose name starts with `prefix` (find_symbol), from its .symtab (local
// symbols included); nullopt when the file has none or is not a well-formed ELF64 file. Read
// with pread, not mapped: a file changed meanwhile can only make the look-up fail.
std::optional<Symbol> symtab_symbol(const char* file, std::string_view prefix) {
  const int fd = open(file, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return std::nullopt;
  struct stat st {};
  std::vector<unsigned char> bytes;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 && st.st_size < (off_t(1) << 31)) {
    bytes.resize(static_cast<std::size_t>(st.st_size));
    std::size_t got = 0;
    for (ssize_t n = 1; got < bytes.size() && n > 0; got += static_cast<std::size_t>(std::max<ssize_t>(n, 0))) {
      n = pread(fd, bytes.data() + got, bytes.size() - got, static_cast<off_t>(got));
    }
    bytes.resize(got);
  }
  close(fd);
  const Mapped f{bytes.data(), bytes.size()};
  const std::span<const Elf64_Shdr> sections = section_headers(f);
  for (const Elf64_Shdr& sh : sections) {
    if (sh.sh_type != SHT_SYMTAB || sh.sh_link >= sections.size()) continue;
    if (std::optional<Symbol> s = find_symbol(f, sh, sections[sh.sh_link], prefix)) return s;
  }
  return std::nullopt;
}

std::optional<std::pair<int, int>> version_beside(const std::string& library) {
  const std::size_t slash = library.rfind('/');
  if (slash == std::string::npos) return std::nullopt;
  std::ifstream in(library.substr(0, slash) + "/../version.py");  // torch/lib/libc10_cuda.so -> torch/version.py
  std::stringstream text;
  text << in.rdbuf();
  return parse_torch_version(text.str());
}

void decide(int state, std::string why) {
  g_why = std::move(why);
  g_state.store(state, std::memory_order_release);
  log(LogLevel::info, "PyTorch's allocator trace: {}", g_why);
}

// Not yet: a later allocation tries again, up to kMaxTries.
void later(const char* why) {
  if (++g_tries >= kMaxTries) return decide(2, fmt::format("off: {} after {} tries", why, g_tries));
  g_why = fmt::format("off so far: {} ({} tries)", why, g_tries);
}

// The object's vtable, if it is the native allocator's (`_ZTV...NativeCachingAllocatorE` in
// the symbol table: the object's vtable pointer is its address point, 16 bytes in), with its
// size in bytes from there; nullptr otherwise.
void* const* native_vtable(void* allocator, const Dl_info& lib, std::uint64_t* bytes) {
  const std::optional<Symbol> table = symtab_symbol(lib.dli_fname, kNativeVtable);
  if (!table || table->size < 16) return nullptr;
  void* const* vtable = *static_cast<void* const* const*>(allocator);
  if (reinterpret_cast<const char*>(vtable) != static_cast<const char*>(lib.dli_fbase) + table->value + 16) return nullptr;
  *bytes = table->size - 16;
  return vtable;
}

// The vtable entry at `offset` bytes, if it lies inside the vtable and is the native
// allocator's method `prefix`.
void* checked_entry(void* const* vtable, std::uint64_t vtable_bytes, long offset, const Dl_info& lib, std::string_view prefix) {
  if (offset < 0 || static_cast<std::uint64_t>(offset) + sizeof(void*) > vtable_bytes) return nullptr;
  const std::optional<Symbol> method = symtab_symbol(lib.dli_fname, prefix);
  if (!method) return nullptr;
  void* entry = vtable[offset / static_cast<long>(sizeof(void*))];
  return entry == static_cast<char*>(lib.dli_fbase) + method->value ? entry : nullptr;
}

// The path of the loaded libc10_cuda.so, or "" (PyTorch's extension loads it RTLD_LOCAL, so
// the global scope may not show its symbols: the loaded objects are searched instead).
std::string loaded_c10_cuda() {
  std::string path;
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* out) {
        const std::string_view name = info->dlpi_name == nullptr ? "" : info->dlpi_name;
        if (!name.ends_with("/libc10_cuda.so")) return 0;
        *static_cast<std::string*>(out) = name;
        return 1;
      },
      &path);
  return path;
}

// `kAllocatorSymbol` in the already loaded `library` (RTLD_NOLOAD: never loads it).
void* allocator_symbol(const std::string& library) {
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) return nullptr;
  void* symbol = real_dlsym()(handle, kAllocatorSymbol);
  dlclose(handle);  // (drops the reference RTLD_NOLOAD took; the library stays loaded)
  return symbol;
}

// The process sees exactly one device (cuDeviceGetCount; ShimCallScope: the shim's own call).
bool single_device() {
  static const bool one = [] {
    ShimCallScope scope;
    int count = 0;
    return real().cuDeviceGetCount != nullptr && real().cuDeviceGetCount(&count) == CUDA_SUCCESS && count == 1;
  }();
  return one;
}

void attempt(Engine& engine) {
#ifdef _LIBCPP_VERSION
  return decide(2, "off: this shim was built with libc++; PyTorch's tracker is a libstdc++ std::function");
#endif
  const std::string library = loaded_c10_cuda();
  void* symbol = library.empty() ? nullptr : allocator_symbol(library);
  if (symbol == nullptr) return later("PyTorch's CUDA allocator (libc10_cuda.so) is not loaded");
  Dl_info lib{};
  if (dladdr(symbol, &lib) == 0 || lib.dli_fname == nullptr) return decide(2, "off: libc10_cuda.so's path is unknown");
  const std::optional<std::pair<int, int>> version = version_beside(lib.dli_fname);
  if (!version) return decide(2, fmt::format("off: no torch/version.py beside {}", lib.dli_fname));
  const std::optional<TorchTraceLayout> layout = torch_trace_layout(version->first, version->second);
  if (!layout) {
    return decide(2, fmt::format("off: torch {}.{} is not a version whose trace layout was checked (2.2 to 2.15)", version->first,
                                 version->second));
  }
  void* allocator = __atomic_load_n(static_cast<void**>(symbol), __ATOMIC_ACQUIRE);
  if (allocator == nullptr) return later("PyTorch's CUDA allocator is not set");
  std::uint64_t vtable_bytes = 0;
  void* const* vtable = native_vtable(allocator, lib, &vtable_bytes);
  void* attach = vtable == nullptr ? nullptr : checked_entry(vtable, vtable_bytes, layout->attach_offset, lib, kNativeAttach);
  void* initialized =
      vtable == nullptr ? nullptr : checked_entry(vtable, vtable_bytes, layout->initialized_offset, lib, kNativeInitialized);
  if (attach == nullptr || initialized == nullptr) {
    return decide(2, fmt::format("off: the CUDA allocator is not torch {}.{}'s native caching allocator as its symbol table "
                                 "shows it (another allocator backend, or a library without .symtab)",
                                 version->first, version->second));
  }
  if (!reinterpret_cast<bool (*)(void*)>(initialized)(allocator)) return later("PyTorch's CUDA allocator is not initialized");
  g_engine.store(&engine, std::memory_order_release);
  Tracker tracker = [](const TorchTraceEntry& e) noexcept { on_event(e); };
  // By value under the Itanium C++ ABI: a non-trivial argument is passed by the address of
  // the caller's copy, which the caller destroys.
  reinterpret_cast<void (*)(void*, Tracker*)>(attach)(allocator, &tracker);
  decide(1, fmt::format("attached: torch {}.{}", version->first, version->second));
}

}  // namespace

std::optional<TorchTraceLayout> torch_trace_layout(int major, int minor) {
  for (const TorchTraceLayout& l : kLayouts) {
    if (l.major == major && l.minor == minor) return l;
  }
  return std::nullopt;
}

std::optional<std::pair<int, int>> parse_torch_version(const std::string& version_py) {
  // (Never destroyed, as g_why.)
  static const std::regex& re = *new std::regex(R"(__version__\s*(?::\s*str\s*)?=\s*['"](\d+)\.(\d+))");
  std::smatch m;
  if (!std::regex_search(version_py, m, re)) return std::nullopt;
  return std::pair<int, int>{std::stoi(m[1]), std::stoi(m[2])};
}

void maybe_attach_torch_tracker(Engine& engine, AttachPoint where) noexcept {
  if (g_state.load(std::memory_order_acquire) != 0) return;
  if (where == AttachPoint::allocation && !single_device()) return;
  // Never wait for another thread's attempt: it may be inside PyTorch's allocator, waiting
  // for the lock of the device this thread's allocation holds (the attach takes every
  // device allocator's lock in turn). This allocation just goes without it.
  std::unique_lock lock(g_mutex, std::try_to_lock);
  if (!lock.owns_lock() || g_state.load(std::memory_order_relaxed) != 0) return;
  try {
    attempt(engine);
  } catch (...) {
    decide(2, "off: an internal error while attaching");
  }
}

std::string torch_tracker_state() {
  // (Never waits: an attempt in progress may be held inside PyTorch's allocator.)
  std::unique_lock lock(g_mutex, std::try_to_lock);
  return lock.owns_lock() ? g_why : "off: being attached";
}

}  // namespace spillway::interpose
