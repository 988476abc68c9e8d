// Thread cancellation inside Spillway's code.
//
// The host may pthread_cancel() any of its threads, and glibc acts on a deferred
// cancellation at a cancellation point (write(2), open(2), nanosleep(2), ...: POSIX
// "Thread Cancellation", pthreads(7)) by unwinding the thread with a forced unwind
// (`abi::__forced_unwind`). A forced unwind that meets a `catch (...)` which does not rethrow
// aborts the process ("FATAL: exception not rethrown"), and one that leaves a noexcept
// function calls std::terminate. Spillway's hooks, its log writer and its callbacks catch
// everything (nothing may cross the C ABI, the shim never breaks its host), so they hold
// cancellation off while they run: a cancellation requested meanwhile is acted on at the
// thread's next cancellation point outside Spillway, exactly as if it had arrived then.
// Deferral is allowed: a driver entry point is no POSIX cancellation point, so the host
// cannot count on being cancelled inside one.
#pragma once

#include <pthread.h>

namespace spillway {

// Disables cancellation of the calling thread for its lifetime and restores the previous
// state (enabled or disabled) on destruction; it never acts on a pending request itself.
// Cost: two pthread_setcancelstate calls (an atomic update of the thread's own flag each).
// Thread-safe (it acts on the calling thread only).
class NoCancelScope {
 public:
  NoCancelScope() noexcept { pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &previous_); }
  ~NoCancelScope() { pthread_setcancelstate(previous_, nullptr); }
  NoCancelScope(const NoCancelScope&) = delete;
  NoCancelScope& operator=(const NoCancelScope&) = delete;

 private:
  int previous_ = PTHREAD_CANCEL_ENABLE;
};

}  // namespace spillway
