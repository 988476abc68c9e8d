// fakecuda core: configuration, call log, failure injection, allocation registry,
// contexts, streams/events and modules of the fake CUDA driver. Semantics follow the CUDA
// 13.0 driver API reference (cuda.h); memory lives in host RAM (mmap per allocation).
#include "core.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>

namespace fakecuda {
namespace {

// ---- configuration -------------------------------------------------------------------
void bad_value(const char* var, const char* value, const char* fallback) {
  std::fprintf(stderr, "fakecuda: ignoring bad %s='%s', using %s\n", var, value, fallback);
}

bool parse_u64(const char* s, uint64_t* out) {
  if (!s || !*s || !std::isdigit(static_cast<unsigned char>(*s))) return false;
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(s, &end, 10);
  if (errno || *end) return false;
  *out = v;
  return true;
}

bool parse_fail(const char* s, std::vector<FailRule>* out) {
  std::string all(s);
  size_t pos = 0;
  while (pos <= all.size()) {
    size_t comma = all.find(',', pos);
    std::string item = all.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    size_t c1 = item.find(':');
    if (c1 == std::string::npos || c1 == 0) return false;
    size_t c2 = item.find(':', c1 + 1);
    FailRule rule;
    rule.name = item.substr(0, c1);
    std::string nth = item.substr(c1 + 1, c2 == std::string::npos ? std::string::npos : c2 - c1 - 1);
    if (!parse_u64(nth.c_str(), &rule.nth) || rule.nth == 0) return false;
    if (c2 != std::string::npos) {
      uint64_t code = 0;
      if (!parse_u64(item.substr(c2 + 1).c_str(), &code) || code == 0 || code > 100000) return false;
      rule.code = static_cast<int>(code);
    }
    out->push_back(rule);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return true;
}

Config g_config;
std::once_flag g_config_once;
std::mutex g_fail_mutex;
std::map<std::string, uint64_t> g_call_counts;  // only names named in FAKECUDA_FAIL

void load_config() {
  Config c;
  if (const char* v = std::getenv("FAKECUDA_TOTAL_MEMORY")) {
    uint64_t n = 0;
    if (parse_u64(v, &n) && n > 0) c.total_memory = n;
    else bad_value("FAKECUDA_TOTAL_MEMORY", v, "17179869184");
  }
  if (const char* v = std::getenv("FAKECUDA_CONCURRENT_MANAGED_ACCESS")) {
    if (!std::strcmp(v, "0") || !std::strcmp(v, "1")) c.concurrent_managed_access = *v - '0';
    else bad_value("FAKECUDA_CONCURRENT_MANAGED_ACCESS", v, "1");
  }
  if (const char* v = std::getenv("FAKECUDA_ASYNC")) {
    if (!std::strcmp(v, "0") || !std::strcmp(v, "1")) c.async = *v == '1';
    else bad_value("FAKECUDA_ASYNC", v, "0");
  }
  if (const char* v = std::getenv("FAKECUDA_LOG"); v && *v) {
    c.log_fd = ::open(v, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (c.log_fd < 0) bad_value("FAKECUDA_LOG", v, "no log");
  }
  if (const char* v = std::getenv("FAKECUDA_FAIL"); v && *v) {
    if (!parse_fail(v, &c.fail)) {
      c.fail.clear();
      bad_value("FAKECUDA_FAIL", v, "no injected failures");
    }
  }
  if (const char* v = std::getenv("FAKECUDA_GPU_MEMORY"); v && *v) {
    uint64_t n = 0;
    if (parse_u64(v, &n) && n >= (uint64_t{1} << kChunkShift)) c.gpu_memory = n;
    else bad_value("FAKECUDA_GPU_MEMORY", v, "no residency model");
  }
  if (const char* v = std::getenv("FAKECUDA_STATS"); v && *v) c.stats_path = v;
  int old_fd = g_config.log_fd;
  g_config = std::move(c);
  if (old_fd >= 0) ::close(old_fd);
  residency_reset(g_config);
  std::lock_guard lock(g_fail_mutex);
  g_call_counts.clear();
}

std::atomic<bool> g_initialized{false};

// Returns the injected result for this call, or CUDA_SUCCESS.
CUresult injected_failure(const char* symbol, const char* base, unsigned flags) {
  const Config& cfg = config();
  if (cfg.fail.empty()) return CUDA_SUCCESS;
  std::lock_guard lock(g_fail_mutex);
  CUresult result = CUDA_SUCCESS;
  auto count = [&](const char* name) {
    bool named = false;
    for (const FailRule& r : cfg.fail) named |= r.name == name;
    if (!named) return;
    uint64_t n = ++g_call_counts[name];
    for (const FailRule& r : cfg.fail) {
      if (r.name != name || r.nth != n || result != CUDA_SUCCESS) continue;
      result = r.code ? static_cast<CUresult>(r.code)
                      : (flags & kAlloc) ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_UNKNOWN;
    }
  };
  count(symbol);
  if (std::strcmp(symbol, base) != 0) count(base);
  return result;
}

}  // namespace

const Config& config() {
  std::call_once(g_config_once, load_config);
  return g_config;
}

void reload_config() {
  config();
  load_config();
}

bool initialized() { return g_initialized.load(); }
void set_initialized() { g_initialized = true; }

// ---- Call ---------------------------------------------------------------------------------
Call::Call(const char* symbol, const char* base, unsigned flags)
    : symbol_(symbol), base_(base), flags_(flags), line_(symbol) {}

Call& Call::hex(const char* key, uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%" PRIx64, v);
  return str(key, buf);
}
Call& Call::dec(const char* key, uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%" PRIu64, v);
  return str(key, buf);
}
Call& Call::sdec(const char* key, int64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%" PRId64, v);
  return str(key, buf);
}
Call& Call::str(const char* key, const char* s) {
  line_ += ' ';
  line_ += key;
  line_ += '=';
  line_ += s ? s : "(null)";
  return *this;
}
Call& Call::stream(CUstream s) {
  ptr("stream", s);
  bool capturing = false;
  {
    std::lock_guard lock(stream_mutex());
    if (Stream* st = lookup_stream(s)) capturing = st->capturing;
  }
  return dec("capturing", capturing);
}

CUresult Call::check() {
  if (!(flags_ & kNoInit) && !initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (CUresult r = injected_failure(symbol_, base_, flags_); r != CUDA_SUCCESS) {
    str("injected", "1");
    return r;
  }
  if ((flags_ & kCtx) && !current_context()) return CUDA_ERROR_INVALID_CONTEXT;
  return CUDA_SUCCESS;
}

CUresult Call::finish(CUresult r) {
  int fd = config().log_fd;
  if (fd >= 0) {
    try {
      line_ += " -> " + std::to_string(static_cast<int>(r)) + "\n";
      ssize_t ignored = ::write(fd, line_.data(), line_.size());  // one write(2) per line
      (void)ignored;
    } catch (...) {
    }
  }
  return r;
}

// ---- allocations ----------------------------------------------------------------------
namespace {
std::mutex g_alloc_mutex;
std::map<uintptr_t, Alloc> g_allocs;  // by base
uint64_t g_device_bytes = 0;
uint64_t g_next_id = 1;
}  // namespace

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::Device: return "device";
    case Kind::Managed: return "managed";
    case Kind::Host: return "host";
    case Kind::Vmm: return "vmm";
  }
  return "?";
}

static bool counts_as_device(Kind k) { return k == Kind::Device; }

bool reserve_device_bytes(size_t n) {
  std::lock_guard lock(g_alloc_mutex);
  if (n > config().total_memory - g_device_bytes) return false;
  g_device_bytes += n;
  return true;
}

void release_device_bytes(size_t n) {
  std::lock_guard lock(g_alloc_mutex);
  g_device_bytes -= n;
}

uint64_t device_bytes_used() {
  std::lock_guard lock(g_alloc_mutex);
  return g_device_bytes;
}

CUresult alloc(Kind kind, size_t size, CUdeviceptr* out, CUmemoryPool pool) {
  if (size == 0) return CUDA_ERROR_INVALID_VALUE;
  if (counts_as_device(kind) && !reserve_device_bytes(size)) return CUDA_ERROR_OUT_OF_MEMORY;
  size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  size_t len = (size + page - 1) / page * page;
  // With the residency model, managed memory starts on a chunk (2 MiB) boundary, as the
  // real driver's managed allocations do: over-reserve, then trim both ends.
  size_t align = kind == Kind::Managed && config().gpu_memory ? size_t{1} << kChunkShift : page;
  size_t extra = align - page;
  void* m = len < size || len + extra < len
                ? MAP_FAILED
                : ::mmap(nullptr, len + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                         -1, 0);
  if (m == MAP_FAILED) {
    if (counts_as_device(kind)) release_device_bytes(size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (extra) {
    uintptr_t start = reinterpret_cast<uintptr_t>(m), base = (start + align - 1) / align * align;
    if (base > start) ::munmap(m, base - start);
    if (start + extra > base) ::munmap(reinterpret_cast<void*>(base + len), start + extra - base);
    m = reinterpret_cast<void*>(base);
  }
  Alloc a;
  a.base = reinterpret_cast<uintptr_t>(m);
  a.size = size;
  a.kind = kind;
  a.map = m;
  a.map_len = len;
  a.pool = pool;
  {
    std::lock_guard lock(g_alloc_mutex);
    a.id = g_next_id++;
    g_allocs[a.base] = a;
  }
  if (kind == Kind::Managed) residency_alloc(a.base, a.size);
  *out = a.base;
  return CUDA_SUCCESS;
}

CUresult release(uintptr_t base, bool (*accept)(Kind)) {
  Alloc a;
  {
    std::lock_guard lock(g_alloc_mutex);
    auto it = g_allocs.find(base);
    if (it == g_allocs.end() || !accept(it->second.kind)) return CUDA_ERROR_INVALID_VALUE;
    a = it->second;
    g_allocs.erase(it);
    if (counts_as_device(a.kind)) g_device_bytes -= a.size;
  }
  if (a.kind == Kind::Managed) residency_free(a.base, a.size);
  if (a.map) ::munmap(a.map, a.map_len);
  return CUDA_SUCCESS;
}

bool managed_overlaps(uintptr_t lo, uintptr_t hi) {
  std::lock_guard lock(g_alloc_mutex);
  for (auto it = g_allocs.lower_bound(hi); it != g_allocs.begin();) {
    --it;  // allocations starting below hi, from the highest down; they do not overlap each other
    if (it->second.base + it->second.size <= lo) return false;
    if (it->second.kind == Kind::Managed) return true;
  }
  return false;
}

bool find(uintptr_t p, Alloc* out) {
  std::lock_guard lock(g_alloc_mutex);
  auto it = g_allocs.upper_bound(p);
  if (it == g_allocs.begin()) return false;
  --it;
  if (p >= it->second.base + it->second.size) return false;
  if (out) *out = it->second;
  return true;
}

bool covers(uintptr_t p, size_t n, bool (*accept)(Kind), Alloc* out) {
  Alloc a;
  if (!find(p, &a) || !accept(a.kind) || n > a.base + a.size - p) return false;
  if (out) *out = a;
  return true;
}

void add_vmm_mapping(uintptr_t base, size_t size) {
  std::lock_guard lock(g_alloc_mutex);
  Alloc a;
  a.base = base;
  a.size = size;
  a.kind = Kind::Vmm;
  a.id = g_next_id++;
  g_allocs[base] = a;
}

bool remove_vmm_mapping(uintptr_t base) {
  std::lock_guard lock(g_alloc_mutex);
  auto it = g_allocs.find(base);
  if (it == g_allocs.end() || it->second.kind != Kind::Vmm) return false;
  g_allocs.erase(it);
  return true;
}

// ---- contexts ------------------------------------------------------------------------------
namespace {
int g_primary_storage;
thread_local std::vector<CUcontext> t_ctx_stack;
thread_local CUstreamCaptureMode t_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
}  // namespace

CUcontext primary_context() { return reinterpret_cast<CUcontext>(&g_primary_storage); }
CUcontext current_context() { return t_ctx_stack.empty() ? nullptr : t_ctx_stack.back(); }
void set_current_context(CUcontext ctx) {
  if (!ctx) {
    if (!t_ctx_stack.empty()) t_ctx_stack.pop_back();
  } else if (t_ctx_stack.empty()) {
    t_ctx_stack.push_back(ctx);
  } else {
    t_ctx_stack.back() = ctx;
  }
}
void push_context(CUcontext ctx) { t_ctx_stack.push_back(ctx); }
bool pop_context(CUcontext* out) {
  if (t_ctx_stack.empty()) return false;
  *out = t_ctx_stack.back();
  t_ctx_stack.pop_back();
  return true;
}
int& primary_refcount() {
  static int refs = 0;
  return refs;
}
CUstreamCaptureMode& thread_capture_mode() { return t_capture_mode; }

// ---- streams and events ------------------------------------------------------------------
namespace {
std::mutex g_stream_mutex;
Stream g_default_stream;
std::set<Stream*> g_streams;
std::set<Event*> g_events;

bool any_kind(Kind) { return true; }

void run_op(const Stream::Op& op) {
  if (op.event) op.event->complete = true;
  if (op.free_base) release(op.free_base, any_kind);
}
}  // namespace

std::mutex& stream_mutex() { return g_stream_mutex; }

bool is_default_stream(CUstream s) {
  return s == nullptr || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD;
}
Stream* lookup_stream(CUstream s) {
  if (is_default_stream(s)) return &g_default_stream;
  auto* st = reinterpret_cast<Stream*>(s);
  return g_streams.count(st) ? st : nullptr;
}
Stream* new_stream() {
  auto* s = new Stream;
  g_streams.insert(s);
  return s;
}
bool delete_stream(CUstream s) {
  auto* st = reinterpret_cast<Stream*>(s);
  if (!g_streams.erase(st)) return false;
  complete(st);  // outstanding work still finishes
  for (Event* e : g_events)
    if (e->stream == st) e->stream = nullptr;
  delete st;
  return true;
}
Event* lookup_event(CUevent e) {
  auto* ev = reinterpret_cast<Event*>(e);
  return g_events.count(ev) ? ev : nullptr;
}
Event* new_event() {
  auto* e = new Event;
  g_events.insert(e);
  return e;
}
bool delete_event(CUevent e) {
  auto* ev = reinterpret_cast<Event*>(e);
  if (!g_events.erase(ev)) return false;
  for (Stream* s : g_streams)
    for (auto& op : s->pending)
      if (op.event == ev) op.event = nullptr;
  for (auto& op : g_default_stream.pending)
    if (op.event == ev) op.event = nullptr;
  delete ev;
  return true;
}
void enqueue(Stream* s, Stream::Op op) {
  if (config().async) s->pending.push_back(op);
  else run_op(op);
}
void complete(Stream* s, Event* upto) {
  while (!s->pending.empty()) {
    Stream::Op op = s->pending.front();
    s->pending.pop_front();
    run_op(op);
    if (upto && op.event == upto) break;
  }
}
void complete_all() {
  complete(&g_default_stream);
  for (Stream* s : g_streams) complete(s);
}
bool any_pending(Stream* s) { return !s->pending.empty(); }

// ---- modules --------------------------------------------------------------------------------
namespace {
std::mutex g_module_mutex;
std::set<Module*> g_modules;
std::set<const Function*> g_functions;
}  // namespace

// image: "name(8,8,4);other(8);noargs()" — parameter sizes in bytes.
bool parse_module(const char* image, Module* out) {
  const char* p = image;
  auto skip = [&] { while (std::isspace(static_cast<unsigned char>(*p))) ++p; };
  for (;;) {
    skip();
    if (!*p) break;
    Function f;
    while (std::isalnum(static_cast<unsigned char>(*p)) || *p == '_') f.name += *p++;
    skip();
    if (f.name.empty() || *p++ != '(') return false;
    size_t offset = 0;
    for (skip(); *p != ')';) {
      char* end = nullptr;
      unsigned long size = std::strtoul(p, &end, 10);
      if (end == p || size == 0 || size > 4096) return false;
      size_t align = size >= 8 ? 8 : (size >= 4 ? 4 : (size >= 2 ? 2 : 1));
      offset = (offset + align - 1) / align * align;
      f.offsets.push_back(offset);
      f.sizes.push_back(size);
      offset += size;
      p = end;
      skip();
      if (*p == ',') ++p, skip();
      else if (*p != ')') return false;
    }
    ++p;
    out->functions.push_back(std::move(f));
    skip();
    if (*p == ';') ++p;
    else if (*p) return false;
  }
  return !out->functions.empty();
}
bool valid_module(CUmodule m) {
  std::lock_guard lock(g_module_mutex);
  return g_modules.count(reinterpret_cast<Module*>(m)) != 0;
}
bool valid_function(CUfunction f) {
  std::lock_guard lock(g_module_mutex);
  return g_functions.count(reinterpret_cast<const Function*>(f)) != 0;
}
namespace {
std::vector<Function*>& free_handles() {  // guarded by g_module_mutex; never destroyed
  static auto* v = new std::vector<Function*>();
  return *v;
}
}  // namespace
void register_module(Module* m) {
  std::lock_guard lock(g_module_mutex);
  g_modules.insert(m);
  for (const Function& f : m->functions) {
    Function* slot = nullptr;
    if (!free_handles().empty()) {
      slot = free_handles().back();
      free_handles().pop_back();
      *slot = f;
    } else {
      slot = new Function(f);
    }
    m->handles.push_back(slot);
    g_functions.insert(slot);
  }
}
void unregister_module(Module* m) {
  std::lock_guard lock(g_module_mutex);
  g_modules.erase(m);
  for (auto it = m->handles.rbegin(); it != m->handles.rend(); ++it) {
    g_functions.erase(*it);
    free_handles().push_back(*it);
  }
  m->handles.clear();
}

// ---- opaque handles ---------------------------------------------------------------------------
namespace {
struct Handle {
  const char* kind;
  uint64_t value;
};
std::mutex g_handle_mutex;
std::map<const void*, Handle*> g_handles;
}  // namespace

void* new_handle(const char* kind, uint64_t value) {
  auto* h = new Handle{kind, value};
  std::lock_guard lock(g_handle_mutex);
  g_handles[h] = h;
  return h;
}
bool handle_is(const void* h, const char* kind, uint64_t* value) {
  std::lock_guard lock(g_handle_mutex);
  auto it = g_handles.find(h);
  if (it == g_handles.end() || std::strcmp(it->second->kind, kind) != 0) return false;
  if (value) *value = it->second->value;
  return true;
}
bool delete_handle(const void* h, const char* kind) {
  std::lock_guard lock(g_handle_mutex);
  auto it = g_handles.find(h);
  if (it == g_handles.end() || std::strcmp(it->second->kind, kind) != 0) return false;
  delete it->second;
  g_handles.erase(it);
  return true;
}

}  // namespace fakecuda
