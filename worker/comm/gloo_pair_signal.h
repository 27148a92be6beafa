// File: worker/comm/gloo_pair_signal.h
//
// Wakes every operation of a Gloo context that waits on one of its TCP pairs: what
// GlooCommunicator::Abort needs and Gloo's closeConnections does not do (it closes the sockets
// without signalling the buffers that wait on them, so a collective blocked in another thread of
// the aborting process waits for its timeout).
//
// How: gloo::transport::tcp::Pair::signalExceptionExternal(msg) on every pair of the context. It
// records an IoException on the pair, signals every buffer with a pending operation on it (their
// waits throw at once) and closes the pair; on a pair that already failed it does nothing. Gloo
// itself calls it when a buffer's wait times out. The packaged headers cannot declare it for us
// (gloo/transport/tcp/pair.h includes gloo/common/memory.h, which libgloo-dev does not ship), so
// gloo_pair_signal.cc declares that one exported member on its own; a libgloo without it fails
// to link, and a pair of another transport is skipped (its dynamic type is checked).
#ifndef SWITCHYARD_WORKER_COMM_GLOO_PAIR_SIGNAL_H_
#define SWITCHYARD_WORKER_COMM_GLOO_PAIR_SIGNAL_H_

#include <string>

namespace gloo {
class Context;
}  // namespace gloo

namespace switchyard::comm {

// Signals `why` on every connected TCP pair of `context` (not this rank's own slot). Returns how
// many pairs were signalled. Any thread, also while another thread is inside a collective of the
// context; the context must stay alive for the call. Gloo exceptions are caught.
int SignalGlooPairs(gloo::Context& context, const std::string& why);

}  // namespace switchyard::comm

#endif  // SWITCHYARD_WORKER_COMM_GLOO_PAIR_SIGNAL_H_
