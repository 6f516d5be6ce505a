// Error types that map to the CLI's exit codes (0 ok, 1 divergence, 2 bad usage/input, 3 engine died).
#pragma once
#include <stdexcept>
#include <string>

namespace mla {

enum ExitCode { ExitCode_ok = 0, ExitCode_divergence = 1, ExitCode_usage = 2, ExitCode_engine = 3 };

// Bad usage or bad input (config, file, shape): exit 2. The message says what and where.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// An engine failed while running (device fault, crash, hang): exit 3.
struct EngineError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// An allocation failed during a run (exit 3): the message says how much, for what; the command adds where.
struct OutOfMemoryError : EngineError {
  using EngineError::EngineError;
};

}  // namespace mla
