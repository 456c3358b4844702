// The skvq command-line program: one subcommand per file (cmd_*.cpp).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "cli_common.hpp"
#include "commands.hpp"
#include "skvq/error.hpp"

int main(int argc, char** argv) {
  CLI::App app{"skvq: sliding-window key/value cache quantization for LLM inference"};
  app.require_subcommand(1);
  std::string active;
  std::vector<std::pair<CLI::App*, std::function<int()>>> commands;
  skvq::tools::register_demo(app, commands);
  skvq::tools::register_generate(app, commands);
  skvq::tools::register_eval(app, commands);
  skvq::tools::register_convert(app, commands);
  skvq::tools::register_quantize(app, commands);
  skvq::tools::register_inspect(app, commands);
  if (argc > 1 && argv[1][0] != '-') {
    std::string known;
    bool found = false;
    for (auto& [sub, run] : commands) {
      known += (known.empty() ? "" : ", ") + sub->get_name();
      found = found || sub->get_name() == argv[1];
    }
    if (!found) {
      std::cerr << "skvq: unknown command '" << argv[1] << "' (commands: " << known << ")\n";
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string msg = e.what();
    for (auto& c : msg) if (c == '\n') c = ' ';
    std::cerr << "skvq: " << msg << " (see skvq --help)\n";
    return 2;
  }
  for (auto& [sub, run] : commands) {
    if (!sub->parsed()) continue;
    try {
      return run();
    } catch (const skvq::tools::UsageError& e) {
      std::cerr << "skvq " << sub->get_name() << ": " << e.what() << "\n";
      return 2;
    } catch (const skvq::Error& e) {
      std::cerr << "skvq " << sub->get_name() << ": " << e.what() << "\n";
      return 2;
    } catch (const std::exception& e) {
      std::cerr << "skvq " << sub->get_name() << ": internal error: " << e.what() << "\n";
      return 1;
    }
  }
  return 2;
}
