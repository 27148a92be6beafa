// File: worker/comm/gloo_pair_signal.cc
#include "worker/comm/gloo_pair_signal.h"

#include <cstring>
#include <exception>
#include <memory>
#include <typeinfo>

#include "gloo/context.h"
#include "gloo/transport/pair.h"

// The one member of Gloo's TCP pair this file calls, declared alone (see the header for why the
// packaged pair.h cannot be included). The definition is libgloo's: exported and non-virtual, so
// the call only needs its name and signature, which are those of gloo 0.0~git20220518 (Debian
// libgloo0); no other translation unit of ours declares this class. Access (protected in Gloo)
// is not part of the symbol.
namespace gloo::transport::tcp {
class Pair {
 public:
  std::exception_ptr signalExceptionExternal(const std::string& msg);
};
}  // namespace gloo::transport::tcp

namespace switchyard::comm {
namespace {

// typeid(gloo::transport::tcp::Pair).name() in the Itanium ABI.
constexpr char kTcpPairTypeName[] = "N4gloo9transport3tcp4PairE";

}  // namespace

int SignalGlooPairs(gloo::Context& context, const std::string& why) {
  int signalled = 0;
  for (int r = 0; r < context.size; ++r) {
    if (r == context.rank) continue;
    try {
      std::unique_ptr<gloo::transport::Pair>& pair = context.getPair(r);
      if (pair == nullptr) continue;
      gloo::transport::Pair& base = *pair;
      if (std::strcmp(typeid(base).name(), kTcpPairTypeName) != 0) continue;
      // tcp::Pair derives from transport::Pair first (its primary base): same address.
      reinterpret_cast<gloo::transport::tcp::Pair*>(&base)->signalExceptionExternal(why);
      ++signalled;
    } catch (const std::exception&) {
      // A pair that cannot be reached or signalled is closed by closeConnections anyway.
    }
  }
  return signalled;
}

}  // namespace switchyard::comm
