// mla-bisect: wires the subcommands and maps errors to exit codes (0 ok, 1 divergence, 2 usage, 3 engine).
#include <algorithm>
#include <iostream>
#include <new>
#include <string>
#include <vector>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <CLI/CLI.hpp>

#include "harness/cli/commands.h"
#include "harness/cli/engines.h"
#include "core/model/errors.h"

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
  // A first word that names no subcommand: say which exist and the nearest (edit distance), not only that one is
  // required.
  if (argc > 1 && argv[1][0] != '-') {
    const std::string word = argv[1];
    std::vector<std::string> names;
    for (const auto* sub : app.get_subcommands([](const CLI::App*) { return true; })) names.push_back(sub->get_name());
    if (std::find(names.begin(), names.end(), word) == names.end()) {
      const auto distance = [](const std::string& a, const std::string& b) {
        std::vector<size_t> row(b.size() + 1);
        for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
        for (size_t i = 1; i <= a.size(); ++i) {
          size_t diag = row[0];
          row[0] = i;
          for (size_t j = 1; j <= b.size(); ++j) {
            const size_t up = row[j];
            row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
            diag = up;
          }
        }
        return row[b.size()];
      };
      std::string nearest, all;
      size_t best = std::string::npos;
      for (const auto& n : names) {
        all += (all.empty() ? "" : ", ") + n;
        if (const size_t d = distance(word, n); d < best) {
          best = d;
          nearest = n;
        }
      }
      std::cerr << "error: '" << word << "' is not a subcommand"
                << (best <= std::max<size_t>(2, word.size() / 3) ? "; did you mean '" + nearest + "'?" : "")
                << "\nsubcommands: " << all << " (mla-bisect SUBCOMMAND --help)\n";
      return mla::ExitCode_usage;
    }
  }
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
