// The `tessel demo` and `tessel bench` subcommands. Each add_*_command registers one
// subcommand on the CLI11 app; its callback stores the exit status in `rc`.
#pragma once

#include <CLI/CLI.hpp>

namespace tessel::cli {

void add_demo_command(CLI::App& app, int& rc);
void add_bench_command(CLI::App& app, int& rc);

}  // namespace tessel::cli
