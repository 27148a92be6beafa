// File: cli/follow.h
//
// Following a job (`syctl watch`, `syctl submit --wait`): WatchJob's replayed and new events and
// the step reports published after the watch started, until the stream ends after the terminal
// event. Table output: one line per event and per step on stdout; when stderr is a terminal a
// progress bar with ETA (redrawn at most every 100 ms) goes to stderr, and the step lines are
// dropped when stdout is a terminal too. json: one WatchJobResponse per line; yaml: one document
// per update; name: nothing.
#ifndef SWITCHYARD_CLI_FOLLOW_H_
#define SWITCHYARD_CLI_FOLLOW_H_

#include <cstdint>
#include <string>

#include "cli/client.h"
#include "cli/render.h"

namespace switchyard::cli {

// Follows job `name` (full "jobs/ID"). `train_iters` (0 if unknown) is the progress bar's end.
// Returns 0 when the job ended SUCCEEDED, 1 when it ended otherwise (FAILED, CANCELLED), or
// client.Fail's code when the stream broke. `verb` prefixes the messages.
int FollowJob(Client& client, Output output, const std::string& verb, const std::string& name,
              int64_t train_iters);

}  // namespace switchyard::cli

#endif  // SWITCHYARD_CLI_FOLLOW_H_
