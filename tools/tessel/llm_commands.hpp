// `tessel run` and `tessel chat`: the LLM engine from the command line (src/llm/).
#pragma once

#include <CLI/CLI.hpp>

namespace tessel::cli {
void add_llm_commands(CLI::App& app, int& rc);
}
