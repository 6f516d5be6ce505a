// mla-bisect: wires the subcommands and maps errors to exit codes (0 ok, 1 divergence, 2 usage, 3 engine).
#include <iostream>
#include <new>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <CLI/CLI.hpp>

#include "harness/cli/commands.h"
#include "harness/cli/engines.h"
#include "harness/model/errors.h"

int main(int argc, char** argv) {
#ifdef __GLIBC__
  // Probe records come and go by the layer (a DeepSeek-V3 layer's at T = 4096: ~45 MB of per-token vectors,
  // allocated as each record is taken and freed when its layer is written). glibc would hand the freed memory
  // back to the kernel (blocks past the mmap threshold, the heap's top past the trim threshold) and fault every
  // page in again for the next layer (on this project's build machine 0.23 ms per 512 KB record faulted in, 0.04
  // reused), the last records' share of it on the end of every layer. Keep it instead (32 MB: glibc's largest).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
  mla::register_engines();
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
  mla::cli::setup_replay(app, exit_code);
  mla::cli::setup_classes(app, exit_code);
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
  } catch (const std::bad_alloc&) {
    std::cerr << "error: out of memory: an allocation failed (the run's estimate did not foresee it; lower --tokens, "
                 "--context, --batch or --layers)\n";
    return mla::ExitCode_engine;
  } catch (const std::exception& e) {
    std::cerr << "internal error: " << e.what() << "\n";
    return mla::ExitCode_engine;
  }
  return exit_code;
}
