// File: common/command_line.h
//
// Abseil flag parsing for our binaries, with one difference from absl::ParseCommandLine: a usage
// flag (--help, --helpfull, --helpshort, --helppackage, --helpon=, --helpmatch=) prints its text
// on stdout and exits 0, as --version does, instead of Abseil's exit code 1. Asking for help is
// not an error (scripts and package checks run `<binary> --help` and test its status). An unknown
// flag or a bad value still exits 1 with Abseil's message on stderr.
#ifndef SWITCHYARD_COMMON_COMMAND_LINE_H_
#define SWITCHYARD_COMMON_COMMAND_LINE_H_

#include <string>
#include <vector>

namespace switchyard {

// Abseil flag names are C++ identifiers; our binaries accept the conventional dashed spelling as
// well: returns argv with "--self-check[=v]" rewritten to "--self_check[=v]" (only the name part,
// never the value; nothing after "--", which ends the flags).
std::vector<std::string> NormalizeFlagNames(int argc, char** argv);

// Parses argv like absl::ParseCommandLine and returns the positional arguments (argv[0] first).
// Call after absl::SetProgramUsageMessage / SetFlagsUsageConfig, before any flag is read.
std::vector<char*> ParseCommandLine(int argc, char* argv[]);

}  // namespace switchyard

#endif  // SWITCHYARD_COMMON_COMMAND_LINE_H_
