// One file per subcommand; each has setup_X (options and --help) and returns the exit code from its callback.
#pragma once
#include <CLI/CLI.hpp>

namespace mla::cli {

// Each setup registers a subcommand whose callback stores its exit code in `exit_code`.
void setup_run(CLI::App& app, int& exit_code);
void setup_bench(CLI::App& app, int& exit_code);
void setup_inspect(CLI::App& app, int& exit_code);
void setup_compare(CLI::App& app, int& exit_code);
void setup_bisect(CLI::App& app, int& exit_code);
void setup_explore(CLI::App& app, int& exit_code);
void setup_zoo(CLI::App& app, int& exit_code);
void setup_golden(CLI::App& app, int& exit_code);
void setup_replay(CLI::App& app, int& exit_code);
void setup_classes(CLI::App& app, int& exit_code);

}  // namespace mla::cli
