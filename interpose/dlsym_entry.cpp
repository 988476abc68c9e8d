// The exported `dlsym`. Compiled WITHOUT sanitizer instrumentation (interpose/CMakeLists.txt):
// sanitizer runtimes (ASan, TSan) resolve their interceptors with dlsym(RTLD_NEXT, ...) while
// they start, before their shadow memory exists; instrumented code run then crashes. So
// nothing on the paths below touches instrumented code, the C++ runtime or a static guard.
//
// RTLD_NEXT means "after the caller's object", and glibc finds the caller from the return
// address of its dlsym. The entry therefore sends RTLD_NEXT lookups to glibc's dlsym with a
// plain jump — the return address is still the real caller's, and glibc searches exactly as
// it would without the shim. RTLD_NEXT lookups are never substituted: whoever asks for "the
// next definition" gets it. Other lookups of names that cannot be hooks ("cu..." only can)
// go straight to glibc as well; the rest to spillway_dlsym_impl (shim.cpp), which may
// substitute a hook.
#include <dlfcn.h>

using DlsymFn = void* (*)(void*, const char*);

extern "C" __attribute__((visibility("hidden"))) void* spillway_dlsym_impl(void* handle, const char* name);

// glibc's dlsym, found with dlvsym so that it is never our own. A race between two first
// calls stores the same value twice. When the shim was not preloaded but dlopen()ed after
// the C library, nothing comes after it to find: libc.so.6's own then (never loaded here,
// only looked up), so that a late-loaded shim passes calls through instead of answering
// CUDA_ERROR_NOT_INITIALIZED.
extern "C" __attribute__((visibility("hidden"))) void* spillway_real_dlsym_for_next() {
  static void* cached = nullptr;
  void* fn = __atomic_load_n(&cached, __ATOMIC_ACQUIRE);
  if (fn != nullptr) return fn;
  fn = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
  if (fn == nullptr) fn = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
  if (fn == nullptr) {
    if (void* libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD)) {
      fn = dlvsym(libc, "dlsym", "GLIBC_2.34");
      if (fn == nullptr) fn = dlvsym(libc, "dlsym", "GLIBC_2.2.5");
    }
  }
  __atomic_store_n(&cached, fn, __ATOMIC_RELEASE);
  return fn;
}

extern "C" __attribute__((visibility("hidden"))) void* spillway_dlsym_entry(void* handle, const char* name) {
  if (name != nullptr && name[0] == 'c' && name[1] == 'u') return spillway_dlsym_impl(handle, name);
  auto real = reinterpret_cast<DlsymFn>(spillway_real_dlsym_for_next());
  return real != nullptr ? real(handle, name) : nullptr;
}

#if defined(__x86_64__)
// RTLD_NEXT is ((void*) -1l) in glibc's <dlfcn.h>. The stack is 16-byte aligned at the call.
asm(R"(
  .text
  .globl dlsym
  .type dlsym, @function
dlsym:
  cmpq $-1, %rdi
  jne 1f
  pushq %rdi
  pushq %rsi
  subq $8, %rsp
  call spillway_real_dlsym_for_next
  addq $8, %rsp
  popq %rsi
  popq %rdi
  testq %rax, %rax
  je 2f
  jmp *%rax
1:
  jmp spillway_dlsym_entry
2:
  xorl %eax, %eax
  ret
  .size dlsym, .-dlsym
)");
#else
#error "the dlsym entry is written for x86-64; port it (one compare and two jumps) first"
#endif
