// Output files that several processes of one run may ask for (SPILLWAY_TRACE and
// SPILLWAY_REPORT are inherited by every process of a tree: a shell, `timeout`, a Python
// launcher and its workers). Each process writes a file of its own, never one another
// process writes.
#pragma once

#include <string>
#include <string_view>

namespace spillway {

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

}  // namespace spillway
