// File: common/port_test_util.h
//
// A TCP port for a test to hand to a child process or server that binds it later.
#ifndef SWITCHYARD_COMMON_PORT_TEST_UTIL_H_
#define SWITCHYARD_COMMON_PORT_TEST_UTIL_H_

namespace switchyard::testing {

// A TCP port that was free a moment ago on every interface (bound on 0.0.0.0, closed); 0 on
// failure. Chosen at random BELOW the kernel's ephemeral range (ip_local_port_range): a port the
// kernel hands out (bind to port 0, or the local end of an outgoing connection) can be taken by
// another test's process before the child that is given this one binds it (seen in CI: a worker's
// --metrics-port "Address already in use" while gRPC and Gloo tests ran beside it).
int FreePort();

}  // namespace switchyard::testing

#endif  // SWITCHYARD_COMMON_PORT_TEST_UTIL_H_
