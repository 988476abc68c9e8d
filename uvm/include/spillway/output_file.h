// Output files that several processes of one run may ask for (SPILLWAY_TRACE and
// SPILLWAY_REPORT are inherited by every process of a tree: a shell, `timeout`, a Python
// launcher and its workers). Each process writes a file of its own, never one another
// process writes.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace spillway {

// The one-line message for a file that could not be written: "cannot write PATH: REASON",
// REASON being strerror(err) (e.g. "cannot write /dev/full: No space left on device").
std::string write_error(std::string_view path, int err);

// Whether fopen(path, "w") can be expected to succeed, asked before a long run so that a
// mistyped output path is refused at once: "" when it can, else one line naming the path and
// the reason ("PATH: is a folder, not a file", "PATH: there is no folder DIR", "PATH: cannot
// write X: REASON", X the file if it exists, else its folder). A check, not a promise:
// OutputFile still reports what fails later (a full disk, /dev/full). Thread-safe.
std::string why_not_writable(const std::string& path);

// A file a command writes whole: a CSV, a timeline, a report. The constructor creates or
// truncates it; write() appends through a buffer; close() flushes and closes it. Every
// output of the `spillway` command and the shim's report goes through it, so that a full
// disk, a quota or /dev/full is an error naming the file, never a short file and status 0.
// Errors: the first failure of open, write, flush or close throws std::runtime_error with
// write_error()'s message (errno read where the call failed); the object is closed then.
// The destructor closes a file not closed yet and loses its errors: call close(). Not
// thread-safe: one thread per object.
class OutputFile {
 public:
  explicit OutputFile(const std::string& path);
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(std::string_view bytes);
  void close();
  const std::string& path() const { return path_; }

 private:
  [[noreturn]] void fail(int err);
  std::string path_;
  std::FILE* file_ = nullptr;
};

// Flushes standard output (std::cout writes through it) and returns write_error("standard
// output", ...) when this or an earlier write to it failed, else "". Call once, before exit.
std::string flush_standard_output();

// Creates `path` for the calling process alone (open(2) with O_CREAT | O_EXCL, mode 0644
// less the umask) and returns it. If it exists — written by another process of the same
// run, or left from an earlier run — the process id is put before the name's extensions
// ("t.jsonl.gz" -> "t.4242.jsonl.gz", "report" -> "report.4242") and that is created the
// same way. Returns "" and sets *error to a one-line reason naming the file when neither
// can be created. A path that exists and is not a regular file (a FIFO, a device such as
// /dev/stdout, a symbolic link) is returned as it is, to be written as it is. Thread-safe.
// (`spillway run` removes the regular files it names before it starts the program, so
// within one run only a second process gets the suffixed name.)
std::string claim_output_file(const std::string& path, std::string* error);

// `path` with `.<pid>` before the extensions of its last component.
std::string with_pid(const std::string& path, long pid);

// SPILLWAY_REPORT and SPILLWAY_TRACE name one file per process (and per rank of a
// distributed job) with these patterns:
//   %p  the process id (getpid(), read when the file is created);
//   %r  the rank: the first of $RANK (torchrun: the global rank, unique across nodes;
//       PyTorch docs "torchrun (Elastic Launch)", "Environment Variables"),
//       $OMPI_COMM_WORLD_RANK (Open MPI), $PMI_RANK (MPICH, Intel MPI), $SLURM_PROCID
//       (Slurm) and $LOCAL_RANK (the rank on this node) that is a decimal number, else 0;
//   %%  a '%'.
// Returns true when every '%' of `pattern` starts one of these (no other '%' may appear).
bool valid_output_pattern(std::string_view pattern);

// The rank %r stands for (above), as text; "0" when no variable holds one. Reads the environment; thread-safe as getenv is.
std::string rank_from_environment();

// `pattern` with %p replaced by `pid`, %r by `rank` and %% by '%'. A pattern that is not
// valid_output_pattern() is returned with its unknown '%' sequences as they are.
std::string expand_output_pattern(std::string_view pattern, long pid, std::string_view rank);

// expand_output_pattern() for the calling process (getpid(), rank_from_environment()).
std::string expand_output_pattern(std::string_view pattern);

// Whether `file_name` is a name the one-component pattern `name_pattern` gives for some
// rank: each %r matches one or more decimal digits, %% a '%', and every other byte itself
// (%p included: callers keep per-process names). `spillway run` removes an earlier run's
// files with it. No regular expression: O(name x pattern) time, which a file name's 255
// bytes bound, whatever bytes either holds. Pure; thread-safe.
bool matches_output_name(std::string_view name_pattern, std::string_view file_name);

}  // namespace spillway
