// File: common/command_line.cc
#include "common/command_line.h"

#include <cstdlib>
#include <iostream>

#include "absl/flags/internal/parse.h"
#include "absl/flags/internal/usage.h"
#include "absl/flags/usage.h"

namespace switchyard {

std::vector<std::string> NormalizeFlagNames(int argc, char** argv) {
  std::vector<std::string> out(argv, argv + argc);
  for (size_t i = 1; i < out.size(); ++i) {
    std::string& a = out[i];
    if (a == "--") break;  // everything after "--" is positional
    if (a.size() < 3 || a[0] != '-' || a[1] != '-') continue;
    const size_t end = a.find('=');
    for (size_t j = 2; j < a.size() && j < end; ++j) {
      if (a[j] == '-') a[j] = '_';
    }
  }
  return out;
}

std::vector<char*> ParseCommandLine(int argc, char* argv[]) {
  // What absl::ParseCommandLine does (Abseil 20220623), with the usage flags handled here.
  std::vector<char*> positional = absl::flags_internal::ParseCommandLineImpl(
      argc, argv, absl::flags_internal::ArgvListAction::kRemoveParsedArgs,
      absl::flags_internal::UsageFlagsAction::kIgnoreUsage,
      absl::flags_internal::OnUndefinedFlag::kAbortIfUndefined);
  // -1: no usage flag; 0: --version or --only_check_args; 1: a help flag. All are successes.
  if (absl::flags_internal::HandleUsageFlags(std::cout, absl::ProgramUsageMessage()) != -1) {
    std::cout.flush();
    std::exit(0);
  }
  return positional;
}

}  // namespace switchyard
