// mla-bisect: wires the subcommands and maps errors to exit codes (0 ok, 1 divergence, 2 usage, 3 engine).
#include <iostream>

#include <CLI/CLI.hpp>

#include "harness/cli/commands.h"
#include "harness/model/errors.h"

int main(int argc, char** argv) {
  CLI::App app{"mla-bisect " MLA_VERSION
               ": differential testing of Multi-head Latent Attention (DeepSeek-V2/V3, Kimi-K2, GLM-5).\n"
               "Runs every MLA stage in a CPU reference and a candidate engine, captures probes, and finds where "
               "they diverge."};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("mla-bisect ") + MLA_VERSION + " (" + MLA_GIT_SHA + ")");
  int exit_code = 0;
  mla::cli::setup_run(app, exit_code);
  mla::cli::setup_bench(app, exit_code);
  mla::cli::setup_inspect(app, exit_code);
  mla::cli::setup_compare(app, exit_code);
  mla::cli::setup_bisect(app, exit_code);
  mla::cli::setup_explore(app, exit_code);
  mla::cli::setup_zoo(app, exit_code);
  mla::cli::setup_golden(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return mla::ExitCode_usage;
  } catch (const mla::UsageError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return mla::ExitCode_usage;
  } catch (const mla::EngineError& e) {
    std::cerr << "engine error: " << e.what() << "\n";
    return mla::ExitCode_engine;
  } catch (const std::exception& e) {
    std::cerr << "internal error: " << e.what() << "\n";
    return mla::ExitCode_engine;
  }
  return exit_code;
}
