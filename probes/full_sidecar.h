// Full tensors kept beside a dump: FILE.full.h5 holds full-level records of some of FILE.h5's probes (bisect keeps
// the first divergent probe's stage, its inputs and outputs, recomputed in process, so that explore can show their
// values after a bisect run at sketch level). A record is taken into the dump only where its checksum equals the
// dump's own record: the values are then exactly the ones the run recorded.
#pragma once
#include <set>
#include <string>
#include <vector>

#include "probes/dump.h"

namespace mla {

// FILE.h5 -> FILE.full.h5 (FILE -> FILE.full.h5 when the name has no .h5).
std::string full_sidecar_path(const std::string& dump_path);

// Writes full_sidecar_path(of.path): the probes of `full` at `layer` named in `names` whose every rank holds its
// tensor, under `of`'s provenance (its command and creation time identify it). Returns how many probes were written
// (0: none had tensors; no file is written then).
size_t write_full_sidecar(const Dump& of, const Dump& full, int layer, const std::set<std::string>& names);

struct SidecarMerge {
  std::string path;                 // the sidecar read ("" if none)
  std::vector<std::string> taken;   // "layer L name" of each record taken
  std::vector<std::string> refused; // "layer L name: why" (checksum or shape differs)
  std::string ignored;              // why the whole file was not used (another run's), "" otherwise
};

// If full_sidecar_path(d.path) exists and was made for `d` (same command and creation time), the full tensors of
// its records replace d's records where d's lack them and the checksums agree.
SidecarMerge merge_full_sidecar(Dump& d);

}  // namespace mla
