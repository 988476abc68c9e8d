// The exec family. A process image replaced by exec runs none of its exit-time code (no
// library destructor: execve(2)), so what the shim writes at exit would be lost: the trace
// (SPILLWAY_TRACE) is created at the first event, and was left empty. Each exec call below
// therefore closes the trace first, whole, then calls the C library's own function; the new
// image (the preload is inherited) records a trace of its own beside it
// (`<name>.<pid>.<ext>`, spillway/output_file.h).
//
// These run in a vfork()ed child too (posix_spawn, CPython's subprocess), on its parent's
// memory and stack: they read atomics and call getpid(), nothing else of the shim's state
// (close_trace_recorder_before_exec acts only in the process that opened the trace), and the
// C library's functions are resolved once when the shim is loaded, not here. glibc's execl,
// execle, execlp, execv, execvp and execvpe call its execve internally, not through the PLT,
// so each is hooked itself. Not hooked: execveat (glibc 2.34+, rare) and posix_spawn (the
// parent image lives on).
#include <dlfcn.h>
#include <errno.h>
#include <unistd.h>

#include <alloca.h>
#include <cstdarg>

#include "shim.h"

#define SPILLWAY_EXPORT extern "C" __attribute__((visibility("default")))

namespace spillway::interpose {
namespace {

using Execve = int (*)(const char*, char* const[], char* const[]);
using Execv = int (*)(const char*, char* const[]);
using Fexecve = int (*)(int, char* const[], char* const[]);

// The C library's definitions: the next after the shim, or libc.so.6's own when the shim was
// dlopen()ed after it (then nothing comes next).
void* next_libc(const char* name) {
  DlsymFn dlsym_fn = real_dlsym();
  if (dlsym_fn == nullptr) return nullptr;
  if (void* p = dlsym_fn(RTLD_NEXT, name)) return p;
  void* libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
  return libc != nullptr ? dlsym_fn(libc, name) : nullptr;
}

Execve g_execve = nullptr;
Execv g_execv = nullptr;
Execv g_execvp = nullptr;
Execve g_execvpe = nullptr;
Fexecve g_fexecve = nullptr;

__attribute__((constructor)) void resolve_exec_family() {
  g_execve = reinterpret_cast<Execve>(next_libc("execve"));
  g_execv = reinterpret_cast<Execv>(next_libc("execv"));
  g_execvp = reinterpret_cast<Execv>(next_libc("execvp"));
  g_execvpe = reinterpret_cast<Execve>(next_libc("execvpe"));
  g_fexecve = reinterpret_cast<Fexecve>(next_libc("fexecve"));
}

// What the image would have written at exit, written now (bounded like the exit path).
void before_exec() { close_trace_recorder_before_exec(std::chrono::milliseconds(200)); }

int missing() {
  errno = ENOSYS;
  return -1;
}

}  // namespace
}  // namespace spillway::interpose

using namespace spillway::interpose;

// The variadic forms gather their arguments on the stack (no heap: a vfork()ed child may call
// them), as execl(3) describes: the list ends with a null pointer; execle's environment follows it.
#define SPILLWAY_GATHER_ARGS(first, list)                                    \
  std::size_t count_ = 1;                                                    \
  {                                                                          \
    va_list counting_;                                                       \
    va_copy(counting_, list);                                                \
    while (va_arg(counting_, char*) != nullptr) ++count_;                    \
    va_end(counting_);                                                       \
  }                                                                          \
  char** argv_ = static_cast<char**>(alloca((count_ + 1) * sizeof(char*)));  \
  argv_[0] = const_cast<char*>(first);                                       \
  for (std::size_t i_ = 1; i_ <= count_; ++i_) argv_[i_] = va_arg(list, char*);

SPILLWAY_EXPORT int execve(const char* path, char* const argv[], char* const envp[]) {
  before_exec();
  return g_execve != nullptr ? g_execve(path, argv, envp) : missing();
}

SPILLWAY_EXPORT int execv(const char* path, char* const argv[]) {
  before_exec();
  return g_execv != nullptr ? g_execv(path, argv) : missing();
}

SPILLWAY_EXPORT int execvp(const char* file, char* const argv[]) {
  before_exec();
  return g_execvp != nullptr ? g_execvp(file, argv) : missing();
}

SPILLWAY_EXPORT int execvpe(const char* file, char* const argv[], char* const envp[]) {
  before_exec();
  return g_execvpe != nullptr ? g_execvpe(file, argv, envp) : missing();
}

SPILLWAY_EXPORT int fexecve(int fd, char* const argv[], char* const envp[]) {
  before_exec();
  return g_fexecve != nullptr ? g_fexecve(fd, argv, envp) : missing();
}

SPILLWAY_EXPORT int execl(const char* path, const char* arg, ...) {
  va_list ap;
  va_start(ap, arg);
  SPILLWAY_GATHER_ARGS(arg, ap)
  va_end(ap);
  return execv(path, argv_);
}

SPILLWAY_EXPORT int execlp(const char* file, const char* arg, ...) {
  va_list ap;
  va_start(ap, arg);
  SPILLWAY_GATHER_ARGS(arg, ap)
  va_end(ap);
  return execvp(file, argv_);
}

SPILLWAY_EXPORT int execle(const char* path, const char* arg, ...) {
  va_list ap;
  va_start(ap, arg);
  SPILLWAY_GATHER_ARGS(arg, ap)
  char* const* envp = va_arg(ap, char* const*);
  va_end(ap);
  return execve(path, argv_, envp);
}
