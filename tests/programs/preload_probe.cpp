// libspillway_preload_probe.so: an unrelated library someone already preloads; `spillway run`
// must keep it in LD_PRELOAD, after libspillway.so.
extern "C" __attribute__((visibility("default"))) int spillway_preload_probe() { return 42; }
