// Where Spillway looks for libcupti (the fault feedback of `learned`, interpose/
// cupti_feedback.cpp), in one place for the shim and `spillway info`.
#pragma once

#include <string>

namespace spillway {

// The sonames tried, newest first: CUDA 13's, CUDA 12's, the unversioned link.
inline constexpr const char* kCuptiSonames[] = {"libcupti.so.13", "libcupti.so.12", "libcupti.so"};

// Opens libcupti: one already loaded (RTLD_NOLOAD, e.g. a framework's), else by soname on
// the loader's search path, else $CUDA_HOME/ then /usr/local/cuda/ + extras/CUPTI/lib64,
// lib64 and lib. Returns the dlopen handle (RTLD_NOW | RTLD_LOCAL), or nullptr. `path`, if
// given, receives the file opened (from dlinfo's link map). Thread-safe as dlopen is.
void* open_cupti_library(std::string* path = nullptr);

// Where open_cupti_library() looks, in one line (for messages when it finds nothing).
inline constexpr const char* kCuptiSearchText =
    "dlopen libcupti.so.13/.12/.so, $CUDA_HOME or /usr/local/cuda/extras/CUPTI/lib64";

}  // namespace spillway
