#include "spillway/cupti_library.h"

#include <dlfcn.h>
#include <link.h>

#include <cstdlib>
#include <vector>

namespace spillway {

namespace {

void* opened(void* handle, std::string* path) {
  if (handle != nullptr && path != nullptr) {
    link_map* map = nullptr;
    if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr) *path = map->l_name;
  }
  return handle;
}

}  // namespace

void* open_cupti_library(std::string* path) {
  for (const char* name : kCuptiSonames) {
    if (void* h = dlopen(name, RTLD_NOW | RTLD_NOLOAD)) return opened(h, path);
  }
  for (const char* name : kCuptiSonames) {
    if (void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL)) return opened(h, path);
  }
  std::vector<std::string> roots;
  if (const char* home = std::getenv("CUDA_HOME"); home != nullptr && *home != '\0') roots.emplace_back(home);
  roots.emplace_back("/usr/local/cuda");
  for (const std::string& root : roots) {
    for (const char* dir : {"/extras/CUPTI/lib64/", "/lib64/", "/lib/"}) {
      const std::string file = root + dir + "libcupti.so";
      if (void* h = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL)) return opened(h, path);
    }
  }
  return nullptr;
}

}  // namespace spillway
