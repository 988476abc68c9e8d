// fakecuda core: configuration, call log, failure injection, devices, allocation registry,
// contexts, streams/events and modules of the fake CUDA driver. Semantics follow the CUDA
// 13.0 driver API reference (cuda.h); memory lives in host RAM (mmap per allocation).
#include "core.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
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

// CUDA_VISIBLE_DEVICES as the driver reads it (CUDA C++ Programming Guide, "CUDA Environment
// Variables"): comma-separated device indices, renumbered 0.. in the list's order; the list
// ends at the first entry that is not a valid index (not a number, out of range, or named
// before), so "1,x,0" is device 1 alone and "-1" hides every device. Empty: no device.
// (GPU-/MIG- UUID entries are not faked: they end the list too.)
std::vector<int> parse_visible(const char* s, int devices) {
  std::vector<int> out;
  std::string all(s);
  for (size_t pos = 0; pos < all.size();) {
    size_t comma = all.find(',', pos);
    std::string item = all.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    item = b == std::string::npos ? std::string() : item.substr(b, e - b + 1);
    uint64_t n = 0;
    if (!parse_u64(item.c_str(), &n) || n >= static_cast<uint64_t>(devices)) break;
    int d = static_cast<int>(n);
    if (std::find(out.begin(), out.end(), d) != out.end()) break;
    out.push_back(d);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

Config g_config;
std::once_flag g_config_once;
// The visible device count, for live_context(), which runs under stream_mutex and so must not
// be the call that loads the configuration (whose reload takes that lock).
std::atomic<int> g_visible_count{0};
void contexts_reset(const Config& cfg);
std::mutex g_fail_mutex;
std::map<std::string, uint64_t> g_call_counts;  // only names named in FAKECUDA_FAIL

void load_config() {
  Config c;
  if (const char* v = std::getenv("FAKECUDA_DEVICES")) {
    uint64_t n = 0;
    if (parse_u64(v, &n) && n >= 1 && n <= kMaxDevices) c.devices = static_cast<int>(n);
    else bad_value("FAKECUDA_DEVICES", v, "1");
  }
  c.visible.clear();
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) {
    c.visible = parse_visible(v, c.devices);
  } else {
    for (int d = 0; d < c.devices; ++d) c.visible.push_back(d);
  }
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
  g_visible_count = static_cast<int>(g_config.visible.size());
  contexts_reset(g_config);
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

int device_count() { return static_cast<int>(config().visible.size()); }
bool valid_device(int device) { return device >= 0 && device < device_count(); }
int physical_ordinal(int device) { return valid_device(device) ? config().visible[device] : -1; }

// ---- Call ---------------------------------------------------------------------------------
Call::Call(const char* symbol, const char* base, unsigned flags)
    : symbol_(symbol), base_(base), flags_(flags), logging_(config().log_fd >= 0) {
  if (logging_) line_ = symbol;
}

// (Without a log nothing is formatted: a context query of the fake then costs what the real
// driver's thread-local read does, and the shim's benchmarks measure the shim.)
Call& Call::hex(const char* key, uint64_t v) {
  if (!logging_) return *this;
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%" PRIx64, v);
  return str(key, buf);
}
Call& Call::dec(const char* key, uint64_t v) {
  if (!logging_) return *this;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%" PRIu64, v);
  return str(key, buf);
}
Call& Call::sdec(const char* key, int64_t v) {
  if (!logging_) return *this;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%" PRId64, v);
  return str(key, buf);
}
Call& Call::str(const char* key, const char* s) {
  if (!logging_) return *this;
  line_ += ' ';
  line_ += key;
  line_ += '=';
  line_ += s ? s : "(null)";
  return *this;
}
Call& Call::stream(CUstream s) {
  if (!logging_) return *this;
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
  if (flags_ & kCtx) return check_current();
  return CUDA_SUCCESS;
}

CUresult Call::finish(CUresult r) {
  int fd = config().log_fd;
  if (logging_ && fd >= 0) {
    bool whole = true;
    try {
      line_ += " -> " + std::to_string(static_cast<int>(r)) + "\n";
    } catch (const std::bad_alloc&) {
      whole = false;
    }
    // One write(2) per line, outside any handler: it is a cancellation point, and a thread
    // cancelled here unwinds through (api() in core.h catches only typed exceptions).
    if (whole) {
      ssize_t ignored = ::write(fd, line_.data(), line_.size());
      (void)ignored;
    }
  }
  return r;
}

// ---- allocations ----------------------------------------------------------------------
namespace {
std::mutex g_alloc_mutex;
std::map<uintptr_t, Alloc> g_allocs;  // by base
uint64_t g_device_bytes[kMaxDevices] = {};  // live device bytes, per visible ordinal
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

// Each device has its own FAKECUDA_TOTAL_MEMORY. The counts live past a reload (the
// allocations do), indexed by the visible ordinal the memory was made on.
bool reserve_device_bytes(int device, size_t n) {
  uint64_t total = config().total_memory;
  if (device < 0 || device >= kMaxDevices) return false;
  std::lock_guard lock(g_alloc_mutex);
  uint64_t& used = g_device_bytes[device];
  if (used > total || n > total - used) return false;
  used += n;
  return true;
}

void release_device_bytes(int device, size_t n) {
  if (device < 0 || device >= kMaxDevices) return;
  std::lock_guard lock(g_alloc_mutex);
  g_device_bytes[device] -= n;
}

uint64_t device_bytes_used(int device) {
  if (device < 0 || device >= kMaxDevices) return 0;
  std::lock_guard lock(g_alloc_mutex);
  return g_device_bytes[device];
}

CUresult alloc(Kind kind, size_t size, CUdeviceptr* out, int device, CUcontext ctx, CUmemoryPool pool) {
  if (size == 0) return CUDA_ERROR_INVALID_VALUE;
  if (counts_as_device(kind) && !reserve_device_bytes(device, size)) return CUDA_ERROR_OUT_OF_MEMORY;
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
    if (counts_as_device(kind)) release_device_bytes(device, size);
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
  a.device = device;
  a.ctx = ctx;
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
    if (counts_as_device(a.kind) && a.device >= 0 && a.device < kMaxDevices) g_device_bytes[a.device] -= a.size;
  }
  if (a.kind == Kind::Managed) residency_free(a.base, a.size);
  if (a.map) ::munmap(a.map, a.map_len);
  return CUDA_SUCCESS;
}

void release_context_allocations(CUcontext ctx) {
  std::vector<uintptr_t> bases;
  {
    std::lock_guard lock(g_alloc_mutex);
    for (const auto& [base, a] : g_allocs)
      if (a.ctx == ctx && a.kind != Kind::Vmm && a.pool == nullptr) bases.push_back(base);
  }
  for (uintptr_t b : bases) release(b, [](Kind) { return true; });
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

void add_vmm_mapping(uintptr_t base, size_t size, int device, CUcontext ctx) {
  std::lock_guard lock(g_alloc_mutex);
  Alloc a;
  a.base = base;
  a.size = size;
  a.kind = Kind::Vmm;
  a.device = device;
  a.ctx = ctx;
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

// ---- contexts, streams and events -----------------------------------------------------------
namespace {
std::mutex g_stream_mutex;
// One primary context per device, at a fixed address (CUcontext handles that stay valid over
// a reload); never destroyed: calls may run on other threads while exit() runs destructors.
Context* primaries() {
  static Context* p = [] {
    auto* a = new Context[kMaxDevices];
    for (int d = 0; d < kMaxDevices; ++d) {
      a[d].device = d;
      a[d].primary = true;
      a[d].legacy.ctx = &a[d];
    }
    return a;
  }();
  return p;
}
std::set<Context*> g_created;  // cuCtxCreate's, not yet destroyed
std::set<Stream*> g_streams;   // cuStreamCreate's
// Streams destroyed while work was pending (FAKECUDA_ASYNC): their handle is invalid, but the
// work still runs until a synchronisation covers it (delete_stream).
std::set<Stream*> g_destroyed;
std::set<Event*> g_events;
thread_local std::vector<CUcontext> t_ctx_stack;
thread_local CUstreamCaptureMode t_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

bool any_kind(Kind) { return true; }

void run_one(Stream* s);

void run_op(const Stream::Op& op) {
  // (A wait: the other stream's work up to the event first; waits form no cycle, as each
  // names work queued before it.)
  while (op.wait_stream != nullptr && op.wait_stream->completed < op.wait_upto && !op.wait_stream->pending.empty()) {
    run_one(op.wait_stream);
  }
  if (op.event) op.event->complete = true;
  if (op.free_base) release(op.free_base, any_kind);
}

void run_one(Stream* s) {
  Stream::Op op = s->pending.front();
  s->pending.pop_front();
  run_op(op);
  ++s->completed;
}


template <class F>
void for_each_stream(F&& f) {
  for (int d = 0; d < kMaxDevices; ++d) f(&primaries()[d].legacy);
  for (Context* c : g_created) f(&c->legacy);
  for (Stream* s : g_streams) f(s);
  for (Stream* s : g_destroyed) f(s);
}

// `gone` is being destroyed (its work has completed): waits on it are satisfied.
void forget_waits_on(Stream* gone) {
  for_each_stream([&](Stream* st) {
    for (Stream::Op& op : st->pending)
      if (op.wait_stream == gone) op.wait_stream = nullptr;
  });
}

// What goes with a context: the work queued on its streams completes, then its streams and
// events are destroyed (cuCtxDestroy: "Destroys and cleans up all resources associated with
// the context", CUDA Driver API, Context Management).
void drop_context_objects(Context* ctx) {
  complete_context(ctx);
  for (std::set<Stream*>* streams : {&g_streams, &g_destroyed}) {
    for (auto it = streams->begin(); it != streams->end();) {
      Stream* st = *it;
      if (st->ctx != ctx) {
        ++it;
        continue;
      }
      it = streams->erase(it);
      for (Event* e : g_events)
        if (e->stream == st) e->stream = nullptr;
      forget_waits_on(st);
      delete st;
    }
  }
  for (Event* e : g_events)
    if (e->stream == &ctx->legacy) e->stream = nullptr;
  for (auto it = g_events.begin(); it != g_events.end();) {
    Event* ev = *it;
    if (ev->ctx != ctx) {
      ++it;
      continue;
    }
    it = g_events.erase(it);
    for_each_stream([&](Stream* st) {
      for (auto& op : st->pending)
        if (op.event == ev) op.event = nullptr;
    });
    delete ev;
  }
}

// (Config reload.) Contexts made by cuCtxCreate are destroyed, primary contexts lose their
// retains and flags, and those of devices no longer visible lose their streams and events.
// Must not call config(): it runs inside the configuration's first load.
void contexts_reset(const Config& cfg) {
  std::lock_guard lock(g_stream_mutex);
  while (!g_created.empty()) destroy_context(reinterpret_cast<CUcontext>(*g_created.begin()));
  for (int d = 0; d < kMaxDevices; ++d) {
    Context& p = primaries()[d];
    if (d >= static_cast<int>(cfg.visible.size())) drop_context_objects(&p);
    p.refcount = 0;
    p.flags = 0;
  }
}
}  // namespace

std::mutex& stream_mutex() { return g_stream_mutex; }

CUcontext primary_context(int device) {
  if (device < 0 || device >= kMaxDevices) return nullptr;
  return reinterpret_cast<CUcontext>(&primaries()[device]);
}

Context* live_context(CUcontext h) {
  if (!h) return nullptr;
  auto* c = reinterpret_cast<Context*>(h);
  for (int d = 0, n = g_visible_count.load(); d < n; ++d)
    if (c == &primaries()[d]) return c;
  return g_created.count(c) ? c : nullptr;
}

CUcontext current_context() { return t_ctx_stack.empty() ? nullptr : t_ctx_stack.back(); }
Context* current() { return live_context(current_context()); }

// A context destroyed while current to this thread stays current, and using it is
// CUDA_ERROR_CONTEXT_IS_DESTROYED (cuCtxDestroy, CUDA Driver API, Context Management).
CUresult check_current() {
  CUcontext top = current_context();
  if (!top) return CUDA_ERROR_INVALID_CONTEXT;
  std::lock_guard lock(g_stream_mutex);
  return live_context(top) ? CUDA_SUCCESS : CUDA_ERROR_CONTEXT_IS_DESTROYED;
}

int current_device() {
  std::lock_guard lock(g_stream_mutex);
  Context* c = current();
  return c ? c->device : -1;
}

Context* create_context(int device, unsigned flags) {
  auto* c = new Context;
  c->device = device;
  c->flags = flags;
  c->legacy.ctx = c;
  g_created.insert(c);
  return c;
}

// Frees the allocations made in it, except pool and VMM memory ("cuCtxDestroy() will not
// destroy memory allocations by cuMemCreate(), cuMemAllocAsync() and
// cuMemAllocFromPoolAsync()"), and pops it if it is current to the calling thread.
bool destroy_context(CUcontext h) {
  auto* c = reinterpret_cast<Context*>(h);
  if (!g_created.count(c)) return false;
  drop_context_objects(c);
  g_created.erase(c);
  release_context_allocations(h);
  if (!t_ctx_stack.empty() && t_ctx_stack.back() == h) t_ctx_stack.pop_back();
  delete c;
  return true;
}

void end_primary_context(int device) {
  if (device < 0 || device >= kMaxDevices) return;
  drop_context_objects(&primaries()[device]);
  release_context_allocations(primary_context(device));
}

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
CUstreamCaptureMode& thread_capture_mode() { return t_capture_mode; }

bool is_default_stream(CUstream s) {
  return s == nullptr || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD;
}
Stream* lookup_stream(CUstream s) {
  if (is_default_stream(s)) {
    Context* c = current();
    return c ? &c->legacy : nullptr;
  }
  auto* st = reinterpret_cast<Stream*>(s);
  return g_streams.count(st) ? st : nullptr;
}
Stream* new_stream(Context* ctx) {
  auto* s = new Stream;
  s->ctx = ctx;
  g_streams.insert(s);
  return s;
}
bool delete_stream(CUstream s) {
  auto* st = reinterpret_cast<Stream*>(s);
  if (!g_streams.erase(st)) return false;
  // "In case the device is still doing work in the stream when cuStreamDestroy() is called,
  // the function will return immediately and the resources associated with the stream will
  // be released automatically once the device has completed all work in the stream"
  // (cuStreamDestroy, CUDA Driver API, Stream Management): the handle is gone, the work keeps
  // running (completed by a synchronisation that covers it: the context's, an event recorded
  // on it, a stream that waits for such an event).
  if (!st->pending.empty()) {
    g_destroyed.insert(st);
    return true;
  }
  for (Event* e : g_events)
    if (e->stream == st) e->stream = nullptr;
  forget_waits_on(st);
  delete st;
  return true;
}
Event* lookup_event(CUevent e) {
  auto* ev = reinterpret_cast<Event*>(e);
  return g_events.count(ev) ? ev : nullptr;
}
Event* new_event(Context* ctx) {
  auto* e = new Event;
  e->ctx = ctx;
  g_events.insert(e);
  return e;
}
bool delete_event(CUevent e) {
  auto* ev = reinterpret_cast<Event*>(e);
  if (!g_events.erase(ev)) return false;
  for_each_stream([&](Stream* s) {
    for (auto& op : s->pending)
      if (op.event == ev) op.event = nullptr;
  });
  delete ev;
  return true;
}
void enqueue(Stream* s, Stream::Op op) {
  if (!config().async) {
    run_op(op);
    return;
  }
  s->pending.push_back(op);
  ++s->enqueued;
  if (op.event != nullptr) op.event->ticket = s->enqueued;
}
void enqueue_wait(Stream* s, Event* e) {
  if (!config().async || e->complete || e->stream == nullptr || e->stream == s) return;  // (in order on its own stream)
  Stream::Op op;
  op.wait_stream = e->stream;
  op.wait_upto = e->ticket;
  enqueue(s, op);
}
void complete(Stream* s, Event* upto) {
  while (!s->pending.empty()) {
    const bool last = upto != nullptr && s->pending.front().event == upto;
    run_one(s);
    if (last) break;
  }
}
void complete_context(Context* ctx) {
  complete(&ctx->legacy);
  for (Stream* s : g_streams)
    if (s->ctx == ctx) complete(s);
  for (Stream* s : g_destroyed)
    if (s->ctx == ctx) complete(s);
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
  uint64_t aux;
};
std::mutex g_handle_mutex;
std::map<const void*, Handle*> g_handles;
}  // namespace

void* new_handle(const char* kind, uint64_t value, uint64_t aux) {
  auto* h = new Handle{kind, value, aux};
  std::lock_guard lock(g_handle_mutex);
  g_handles[h] = h;
  return h;
}
bool handle_is(const void* h, const char* kind, uint64_t* value, uint64_t* aux) {
  std::lock_guard lock(g_handle_mutex);
  auto it = g_handles.find(h);
  if (it == g_handles.end() || std::strcmp(it->second->kind, kind) != 0) return false;
  if (value) *value = it->second->value;
  if (aux) *aux = it->second->aux;
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
