// Golden dumps (golden/): made by the FP32 reference with every probe in full and written atomically,
// listed in golden/MANIFEST.json (file, sha256, command, tool_version, created); checked by re-running an engine
// in process on the golden's own inputs, config and run spec, and comparing probe by probe.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "harness/compare/compare.h"
#include "core/model/sha256.h"
#include "probes/dump.h"

namespace mla {

// Runs the FP32 reference over every probe in full (synthetic weights from `weight_seed`, synthetic inputs from
// spec.seed) and returns the golden as a Dump; `command` is the command line that made it (recorded in
// meta.command, so a stale golden can say how to regenerate it). The caller writes it with write_dump_h5.
Dump make_golden(const MlaConfig& cfg, const RunSpec& spec, uint64_t weight_seed, const std::string& command);

struct GoldenCheckOptions {
  std::string engine = "reference";  // engine and options, e.g. reference:precision=bf16, cuda
  std::string inject;                // planted in the engine (docs/bugs.md), to prove the check catches bugs
  int tp = 0;                        // 0: the golden's tp
  double k = 4.0;                    // tolerance = k x calibrated noise floor (non-FP32 candidates)
  std::map<std::string, double> overrides;  // --tol probe=value
  double timeout_s = 0;              // per-stage watchdog (0: off); a hang exits 3 after `on_stop`
  std::vector<std::string> only;           // --probes: check only these (CompareOptions::only)
  std::vector<std::string> allow_missing;  // --allow-missing (CompareOptions::allow_missing)
};

struct GoldenCheck {
  Dump candidate;        // the engine's run, in memory, full probes
  CompareReport report;  // candidate vs golden
};

// Re-runs the engine on the golden's inputs, config and run spec (Dump::config(), Dump::spec(), /inputs, synthetic
// weights from meta.run_options' weight_seed) and compares at tolerance_for(candidate, golden, "auto", k): an FP32
// candidate is held to the FP32 floor, a bf16/fp16 one to the calibrated noise floor. Every probe of the golden's
// stage graph must be matched (report.exit_code(): a missing one fails unless allowed). An EngineError ends the
// candidate's run early: its status says "stopped: ..." and so does the report. Throws UsageError when the golden
// cannot be re-run (no inputs, no run options, non-synthetic weights). `on_stop` (optional) is called with the
// status before a watchdog ends the process.
GoldenCheck check_golden(const Dump& golden, const GoldenCheckOptions& opt,
                         const std::function<void(const std::string&)>& on_stop = nullptr);

// golden/MANIFEST.json: {"format": "mla-bisect-golden-manifest", "version": 1, "goldens": [entries sorted by file]}.
struct ManifestEntry {
  std::string file;          // relative to the manifest's directory
  std::string sha256;
  std::string command;       // the command that made it (run from the repository root)
  std::string tool_version;
  std::string created;       // UTC, from the dump
};
std::vector<ManifestEntry> read_manifest(const std::string& path);  // a missing file is an empty manifest
void write_manifest(const std::string& path, const std::vector<ManifestEntry>& entries);  // temp + fsync + rename
// Reads a golden's provenance and hashes it; `file` is its path relative to `manifest_dir`.
ManifestEntry manifest_entry(const std::string& golden_path, const std::string& manifest_dir);
// Adds or replaces the entries of `goldens` in the manifest at `manifest_path`; with `prune`, drops entries whose
// file no longer exists. Returns the entries written.
std::vector<ManifestEntry> update_manifest(const std::string& manifest_path, const std::vector<std::string>& goldens,
                                           bool prune);

}  // namespace mla
