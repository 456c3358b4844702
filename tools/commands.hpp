// Registration of the skvq subcommands with the CLI11 app.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <utility>
#include <vector>

namespace skvq::tools {

using CommandList = std::vector<std::pair<CLI::App*, std::function<int()>>>;

void register_quantize(CLI::App& app, CommandList& commands);
void register_demo(CLI::App& app, CommandList& commands);
void register_inspect(CLI::App& app, CommandList& commands);
void register_generate(CLI::App& app, CommandList& commands);
void register_eval(CLI::App& app, CommandList& commands);
void register_convert(CLI::App& app, CommandList& commands);

}  // namespace skvq::tools
