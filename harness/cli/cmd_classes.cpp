// `mla-bisect classes`: the catalogue of bug classes the diagnosis re-runs a divergent stage under.
#include <iostream>
#include <memory>

#include "harness/cli/commands.h"
#include "harness/hypotheses/hypotheses.h"

namespace mla::cli {

void setup_classes(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand(
      "classes",
      "List the bug classes a diagnosis is tested against: for the stage that introduced a divergence, each class's "
      "variant of the reference's computation is re-run on the stage's own inputs (its parameters fitted), and a class "
      "that reproduces the candidate within tolerance is reported as confirmed");
  auto markdown = std::make_shared<bool>(false);
  cmd->add_flag("--markdown", *markdown, "Print the catalogue as markdown tables (docs/hypotheses.md is made from it)");
  cmd->callback([markdown, &exit_code] {
    std::cout << (*markdown ? hyp::catalogue_markdown() : hyp::catalogue_text());
    exit_code = 0;
  });
}

}  // namespace mla::cli
