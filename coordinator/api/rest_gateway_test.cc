// REST gateway tests against a real CoordinatorServer on loopback (httplib client): every route,
// the error mapping and body shape, authentication on every API route, and a /metrics scrape
// parsed from the text exposition.
#include <httplib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/config/config.h"
#include "common/http_test_util.h"
#include "coordinator/api/api_test_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace switchyard::api {
namespace {

using Json = nlohmann::json;

class RestGatewayTest : public ::testing::Test {
 protected:
  void Start(const std::string& name) {
    server_ = testing::StartServer(name);
    ASSERT_NE(server_, nullptr);
    client_ = std::make_unique<httplib::Client>("127.0.0.1", server_->http_port());
    client_->set_read_timeout(30, 0);
  }

  httplib::Headers Auth(const char* token = testing::kToken) {
    if (token == nullptr) return {};
    return {{"Authorization", absl::StrCat("Bearer ", token)}};
  }

  // Sends the request and returns (status, parsed JSON body); prints both as evidence.
  std::pair<int, Json> Call(const std::string& method, const std::string& path,
                            const std::string& body = "", const char* token = testing::kToken) {
    httplib::Result r =
        method == "GET"    ? client_->Get(path.c_str(), Auth(token))
        : method == "POST" ? client_->Post(path.c_str(), Auth(token), body, "application/json")
        : method == "PUT"  ? client_->Put(path.c_str(), Auth(token), body, "application/json")
                           : client_->Delete(path.c_str(), Auth(token));
    EXPECT_TRUE(r) << method << " " << path << ": " << httplib::to_string(r.error());
    if (!r) return {0, Json()};
    std::printf("  %-4s %-40s -> %d %s\n", method.c_str(), path.c_str(), r->status,
                r->body.substr(0, 160).c_str());
    EXPECT_EQ(r->get_header_value("Content-Type"), "application/json") << path;
    Json json = Json::parse(r->body, nullptr, /*allow_exceptions=*/false);
    EXPECT_FALSE(json.is_discarded()) << r->body;
    return {r->status, json};
  }

  std::string CreateBody(const std::string& display_name, const std::string& request_id = "") {
    Json body = {{"spec", Json::parse(JobSpecToJson(testing::ValidSpec(display_name)))}};
    if (!request_id.empty()) body["request_id"] = request_id;
    return body.dump();
  }

  static void ExpectError(const std::pair<int, Json>& r, int http, const std::string& status,
                          const std::string& needle = "") {
    EXPECT_EQ(r.first, http);
    ASSERT_TRUE(r.second.contains("error")) << r.second.dump();
    const Json& e = r.second["error"];
    EXPECT_EQ(e["code"], http);
    EXPECT_EQ(e["status"], status);
    EXPECT_TRUE(e["message"].is_string());
    EXPECT_TRUE(e["reason"].is_string() && !e["reason"].get<std::string>().empty());
    if (!needle.empty()) {
      EXPECT_TRUE(absl::StrContains(e["message"].get<std::string>(), needle))
          << e["message"] << " should name " << needle;
    }
  }

  std::unique_ptr<CoordinatorServer> server_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(RestGatewayTest, JobRoutes) {
  Start("rest_jobs.db");
  auto created = Call("POST", "/v1/jobs", CreateBody("rest-1", "r-1"));
  ASSERT_EQ(created.first, 200);
  const Json& job = created.second;
  EXPECT_EQ(job["name"], "jobs/1");
  EXPECT_EQ(job["state"], "PENDING");
  EXPECT_EQ(job["spec"]["display_name"], "rest-1");
  EXPECT_EQ(job["spec"]["model"]["hidden_size"], 1024);  // proto field names
  EXPECT_EQ(job["spec"]["model"]["moe_router_topk"], 2);
  EXPECT_EQ(job["spec"]["training"]["train_iters"], "1000");  // int64 as a string (proto3)
  EXPECT_TRUE(job["create_time"].is_string());                // RFC 3339

  // Idempotent per request_id; another spec under it is 409.
  EXPECT_EQ(Call("POST", "/v1/jobs", CreateBody("rest-1", "r-1")).second["name"], "jobs/1");
  ExpectError(Call("POST", "/v1/jobs", CreateBody("other", "r-1")), 409, "ALREADY_EXISTS",
              "request_id");
  ASSERT_EQ(Call("POST", "/v1/jobs", CreateBody("rest-2")).first, 200);
  ASSERT_EQ(Call("POST", "/v1/jobs", CreateBody("rest-3")).first, 200);

  auto got = Call("GET", "/v1/jobs/1");
  ASSERT_EQ(got.first, 200);
  // GET adds the latest event (CREATED, or what the job waits for); otherwise the POST answer,
  // except update_time: the scheduler may have recorded the wait reason (an event, which moves
  // update_time) between the POST and the GET (seen under load).
  EXPECT_TRUE(got.second["last_event"]["reason"].is_string()) << got.second;
  got.second.erase("last_event");
  // ... and, once a scheduler pass has seen the waiting job, its place in the admission order
  // (Job.queue_status): jobs/1 is the first of the default queue.
  if (got.second.contains("queue_status")) {
    EXPECT_EQ(got.second["queue_status"]["queue"], "default") << got.second;
    EXPECT_EQ(got.second["queue_status"]["position"], 1) << got.second;
    EXPECT_TRUE(got.second["queue_status"]["reason"].is_string()) << got.second;
    got.second.erase("queue_status");
  }
  EXPECT_GE(got.second["update_time"].get<std::string>(), job["update_time"].get<std::string>());
  got.second.erase("update_time");
  Json posted = job;
  posted.erase("update_time");
  EXPECT_EQ(got.second, posted);
  ExpectError(Call("GET", "/v1/jobs/99"), 404, "NOT_FOUND", "jobs/99");
  ExpectError(Call("GET", "/v1/jobs/abc"), 400, "INVALID_ARGUMENT", "name");

  // List: all, filtered, paginated.
  auto all = Call("GET", "/v1/jobs");
  ASSERT_EQ(all.first, 200);
  EXPECT_EQ(all.second["jobs"].size(), 3u);
  EXPECT_FALSE(all.second.contains("next_page_token"));
  std::vector<std::string> names;
  std::string token;
  int pages = 0;
  do {
    std::string path = "/v1/jobs?state=PENDING&page_size=2";
    if (!token.empty()) path += "&page_token=" + httplib::detail::encode_query_param(token);
    auto page = Call("GET", path);
    ASSERT_EQ(page.first, 200);
    for (const Json& j : page.second["jobs"]) names.push_back(j["name"]);
    token = page.second.value("next_page_token", "");
    ++pages;
  } while (!token.empty() && pages < 5);
  EXPECT_EQ(names, (std::vector<std::string>{"jobs/1", "jobs/2", "jobs/3"}));
  EXPECT_EQ(pages, 2);
  ExpectError(Call("GET", "/v1/jobs?state=BOGUS"), 400, "INVALID_ARGUMENT", "state");
  ExpectError(Call("GET", "/v1/jobs?page_size=ten"), 400, "INVALID_ARGUMENT", "page_size");
  ExpectError(Call("GET", "/v1/jobs?page_size=-1"), 400, "INVALID_ARGUMENT", "page_size");
  ExpectError(Call("GET", "/v1/jobs?colour=red"), 400, "INVALID_ARGUMENT", "colour");
  ExpectError(Call("GET", "/v1/jobs?page_token=garbage"), 400, "INVALID_ARGUMENT", "page_token");

  // Cancel, then the refused second cancel (FAILED_PRECONDITION -> 400).
  auto cancelled = Call("POST", "/v1/jobs/2:cancel");
  ASSERT_EQ(cancelled.first, 200);
  EXPECT_EQ(cancelled.second["state"], "CANCELLED");
  ExpectError(Call("POST", "/v1/jobs/2:cancel"), 400, "FAILED_PRECONDITION", "CANCELLED");
  ExpectError(Call("POST", "/v1/jobs/77:cancel"), 404, "NOT_FOUND");
  auto cancelled_list = Call("GET", "/v1/jobs?state=CANCELLED");
  ASSERT_EQ(cancelled_list.second["jobs"].size(), 1u);
  EXPECT_EQ(cancelled_list.second["jobs"][0]["name"], "jobs/2");
}

// A client that streams its body (Transfer-Encoding: chunked, here in 7-byte chunks) creates a
// job like one that sends a Content-Length.
TEST_F(RestGatewayTest, ChunkedCreateBody) {
  Start("rest_chunked.db");
  const std::string body = CreateBody("rest-chunked");
  httplib::Result r = client_->Post(
      "/v1/jobs", Auth(),
      [&body](size_t offset, httplib::DataSink& sink) {
        if (offset < body.size()) {
          sink.write(body.data() + offset, std::min<size_t>(7, body.size() - offset));
        } else {
          sink.done();
        }
        return true;
      },
      "application/json");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  std::printf("  POST /v1/jobs (chunked, %zu bytes in 7-byte chunks) -> %d %s\n", body.size(),
              r->status, r->body.substr(0, 120).c_str());
  ASSERT_EQ(r->status, 200) << r->body;
  Json job = Json::parse(r->body, nullptr, /*allow_exceptions=*/false);
  EXPECT_EQ(job["name"], "jobs/1");
  EXPECT_EQ(job["spec"]["display_name"], "rest-chunked");
  EXPECT_EQ(Call("GET", "/v1/jobs/1").second["spec"]["display_name"], "rest-chunked");
}

TEST_F(RestGatewayTest, BadBodiesNameTheField) {
  Start("rest_bad.db");
  ExpectError(Call("POST", "/v1/jobs", "{not json"), 400, "INVALID_ARGUMENT", "request body");
  ExpectError(Call("POST", "/v1/jobs", R"({"spec": {"model": {"hidden_size": "big"}}})"), 400,
              "INVALID_ARGUMENT", "spec.model.hidden_size");
  ExpectError(Call("POST", "/v1/jobs", R"({"spek": {}})"), 400, "INVALID_ARGUMENT", "spek");
  Json spec = Json::parse(JobSpecToJson(testing::ValidSpec()));
  spec["model"]["num_experts"] = 6;
  ExpectError(Call("POST", "/v1/jobs", Json({{"spec", spec}}).dump()), 400, "INVALID_ARGUMENT",
              "model.num_experts (6) must be divisible by parallel.expert_model_parallel_size (4)");
  ExpectError(Call("POST", "/v1/jobs", ""), 400, "INVALID_ARGUMENT", "spec: required");
  // Nothing was written; the server still serves.
  auto list = Call("GET", "/v1/jobs");
  ASSERT_EQ(list.first, 200);
  EXPECT_FALSE(list.second.contains("jobs"));
  // A body over kMaxRestBodyBytes is refused before parsing.
  auto huge = Call("POST", "/v1/jobs", std::string(kMaxRestBodyBytes + 1024, ' '));
  ExpectError(huge, 413, "INVALID_ARGUMENT", "larger than");
  // Unknown routes and wrong methods keep the error shape (405 + Allow: WrongMethodIs405).
  ExpectError(Call("GET", "/v2/jobs"), 404, "NOT_FOUND", "/v2/jobs");
  ExpectError(Call("PUT", "/v1/jobs/1"), 405, "UNIMPLEMENTED", "PUT");
}

// Malformed bodies of every kind (random bytes, truncated valid JSON, deep nesting, wrong
// types, huge numbers) each get 400 with the JSON error body; nothing is written and the server
// keeps serving.
TEST_F(RestGatewayTest, MalformedBodiesAreRejectedAndTheServerKeepsServing) {
  Start("rest_malformed.db");
  const unsigned seed = std::random_device{}();
  std::mt19937 rng(seed);
  std::printf("seed %u\n", seed);
  const std::string valid = CreateBody("valid");
  std::vector<std::string> bodies;
  for (int i = 0; i < 20; ++i) {  // random bytes
    std::string b(1 + rng() % 200, '\0');
    for (char& c : b) c = static_cast<char>(rng() % 256);
    bodies.push_back(b);
  }
  for (int i = 0; i < 20; ++i) bodies.push_back(valid.substr(0, 1 + rng() % (valid.size() - 2)));
  bodies.push_back(std::string(5000, '[') + std::string(5000, ']'));
  bodies.push_back(std::string(100, '{') + std::string(100, '}'));
  for (const char* b :
       {"null", "[]", "42", "\"spec\"", "{\"spec\": null}", "{\"spec\": []}",
        "{\"spec\": {\"model\": 1}}", "{\"request_id\": 7}",
        "{\"spec\": {\"model\": {\"hidden_size\": 1e400}}}",
        "{\"spec\": {\"model\": {\"hidden_size\": 99999999999999999999}}}",
        "{\"spec\": {\"training\": {\"train_iters\": \"12x\"}}}", "{\"spec\": {}, \"spec\": {}}",
        "{\"spec\": {\"display_name\": \"\\ud800\"}}", "\xef\xbb\xbf{}",
        "{\"spec\": {\"model\": {\"num_layers\": -1}}}"}) {
    bodies.push_back(b);
  }
  int rejected = 0;
  for (const std::string& body : bodies) {
    httplib::Result r = client_->Post("/v1/jobs", Auth(), body, "application/json");
    ASSERT_TRUE(r) << "server stopped answering";
    EXPECT_EQ(r->status, 400) << body.substr(0, 80) << " -> " << r->body;
    Json json = Json::parse(r->body, nullptr, false);
    ASSERT_FALSE(json.is_discarded()) << r->body;
    EXPECT_EQ(json["error"]["status"], "INVALID_ARGUMENT") << r->body;
    rejected += r->status == 400;
  }
  auto list = Call("GET", "/v1/jobs");
  ASSERT_EQ(list.first, 200);
  EXPECT_FALSE(list.second.contains("jobs"));
  ASSERT_EQ(Call("POST", "/v1/jobs", valid).first, 200);
  std::printf("%d of %zu malformed bodies rejected with 400; store still empty, server serving\n",
              rejected, bodies.size());
}

TEST_F(RestGatewayTest, PlanRoute) {
  Start("rest_plan.db");
  v1::PlanRequest request;
  *request.mutable_spec() = testing::ValidSpec();
  *request.mutable_cluster() = testing::Cluster32();
  Json body = {{"spec", Json::parse(JobSpecToJson(request.spec()))},
               {"cluster", Json::parse(MessageToJsonText(request.cluster()))}};
  auto plan = Call("POST", "/v1/plans", body.dump());
  ASSERT_EQ(plan.first, 200);
  EXPECT_TRUE(plan.second["best"]["mapping"].contains("tensor_model_parallel_size"));
  EXPECT_GT(plan.second["best"]["time"]["total"].get<double>(), 0);
  body["cluster"]["num_gpus"] = 0;
  ExpectError(Call("POST", "/v1/plans", body.dump()), 400, "INVALID_ARGUMENT", "cluster.num_gpus");
  body["cluster"]["num_gpus"] = 32;
  body["cluster"]["gpu_memory_bytes"] = 1e6;  // nothing fits: RESOURCE_EXHAUSTED -> 429
  ExpectError(Call("POST", "/v1/plans", body.dump()), 429, "RESOURCE_EXHAUSTED",
              "gpu_memory_bytes");
}

TEST_F(RestGatewayTest, EveryApiRouteRequiresTheToken) {
  Start("rest_auth.db");
  ASSERT_EQ(Call("POST", "/v1/jobs", CreateBody("kept")).first, 200);
  struct Route {
    const char* method;
    const char* path;
  };
  const Route routes[] = {{"POST", "/v1/jobs"},
                          {"GET", "/v1/jobs"},
                          {"GET", "/v1/jobs/1"},
                          {"POST", "/v1/jobs/1:cancel"},
                          {"POST", "/v1/plans"}};
  int checked = 0;
  for (const char* token : {static_cast<const char*>(nullptr), "nope"}) {
    for (const Route& r : routes) {
      auto result = Call(r.method, r.path, CreateBody("intruder"), token);
      ExpectError(result, 401, "UNAUTHENTICATED");
      EXPECT_EQ(result.second["error"]["reason"], token ? "INVALID_TOKEN" : "MISSING_TOKEN");
      ++checked;
    }
  }
  EXPECT_EQ(checked, 10);
  auto job = Call("GET", "/v1/jobs/1");
  EXPECT_EQ(job.second["state"], "PENDING");             // the refused cancel did nothing
  EXPECT_FALSE(Call("GET", "/v1/jobs/2").first == 200);  // the refused create did nothing
  // /metrics and /healthz need no token.
  auto metrics = client_->Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  auto health = client_->Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(health->body, "ok\n");
}

// A known path with another method is 405 with the methods it has in `Allow`, in the JSON error
// shape; an unknown path stays 404.
TEST_F(RestGatewayTest, WrongMethodIs405WithAllow) {
  Start("rest_405.db");
  struct Case {
    const char* method;
    const char* path;
    const char* allow;
  };
  for (const Case& c :
       {Case{"POST", "/v1/jobs/1", "GET, DELETE"}, Case{"GET", "/v1/plans", "POST"},
        Case{"DELETE", "/v1/jobs", "POST, GET"}, Case{"GET", "/v1/jobs/1:cancel", "POST"},
        Case{"POST", "/healthz", "GET"}}) {
    httplib::Result r = c.method[0] == 'G'   ? client_->Get(c.path, Auth())
                        : c.method[0] == 'P' ? client_->Post(c.path, Auth(), "", "application/json")
                                             : client_->Delete(c.path, Auth());
    ASSERT_TRUE(r) << c.path;
    std::printf("  %-6s %-20s -> %d Allow: %s %s\n", c.method, c.path, r->status,
                r->get_header_value("Allow").c_str(), r->body.c_str());
    EXPECT_EQ(r->status, 405) << c.path;
    EXPECT_EQ(r->get_header_value("Allow"), c.allow) << c.path;
    Json json = Json::parse(r->body, nullptr, false);
    EXPECT_EQ(json["error"]["code"], 405) << r->body;
    EXPECT_EQ(json["error"]["status"], "UNIMPLEMENTED") << r->body;
  }
  ExpectError(Call("GET", "/v1/nothing"), 404, "NOT_FOUND", "/v1/nothing");
}

// What GET /v1/jobs/{id} writes (int64 as strings, the proto3 JSON mapping) is accepted as a
// request body, and so is the same spec with int64 as numbers.
TEST_F(RestGatewayTest, GetOutputPostsBack) {
  Start("rest_roundtrip.db");
  ASSERT_EQ(Call("POST", "/v1/jobs", CreateBody("round")).first, 200);
  auto got = Call("GET", "/v1/jobs/1");
  ASSERT_EQ(got.first, 200);
  Json spec = got.second["spec"];
  ASSERT_TRUE(spec["training"]["train_iters"].is_string()) << spec.dump();
  auto again = Call("POST", "/v1/jobs", Json({{"spec", spec}}).dump());
  ASSERT_EQ(again.first, 200);
  EXPECT_EQ(again.second["spec"], spec);
  spec["training"]["train_iters"] = 1000;  // the number form
  auto number = Call("POST", "/v1/jobs", Json({{"spec", spec}}).dump());
  ASSERT_EQ(number.first, 200);
  EXPECT_EQ(number.second["spec"]["training"]["train_iters"], "1000");
  spec["training"]["train_iters"] = "1000x";
  ExpectError(Call("POST", "/v1/jobs", Json({{"spec", spec}}).dump()), 400, "INVALID_ARGUMENT",
              "spec.training.train_iters");
}

// Issue 17: 64 connections from 127.0.0.2..5 (16 each, the gateway's per-client cap) send a
// request one byte at a time; /healthz, /metrics and an authenticated GET /v1/jobs/1 from
// 127.0.0.1 each answer within 100 ms (the requirement; printed), and a 17th connection from an
// attacker's address gets 503 UNAVAILABLE in the JSON error shape.
TEST_F(RestGatewayTest, SlowClientsDoNotStarveTheGateway) {
  Start("rest_slowloris.db");
  ASSERT_EQ(Call("POST", "/v1/jobs", CreateBody("held")).first, 200);
  const int cap = RestGateway::Limits().max_connections_per_client;
  ASSERT_EQ(cap, 16);
  switchyard::testing::SlowClients attack(
      server_->http_port(), 64, /*first_host=*/2, /*hosts=*/4,
      "POST /v1/jobs HTTP/1.1\r\nContent-Length: 10\r\nX-Pad: " + std::string(4000, 'a'),
      absl::Milliseconds(200));
  ASSERT_EQ(attack.connected(), 64);
  absl::SleepFor(absl::Milliseconds(600));  // accepted, several bytes into each request
  const std::pair<const char*, httplib::Headers> calls[] = {
      {"/healthz", {}}, {"/metrics", {}}, {"/v1/jobs/1", Auth()}};
  for (const auto& [path, headers] : calls) {
    httplib::Client fresh("127.0.0.1", server_->http_port());
    fresh.set_keep_alive(false);
    const absl::Time start = absl::Now();
    httplib::Result r = fresh.Get(path, headers);
    const absl::Duration took = absl::Now() - start;
    ASSERT_TRUE(r) << path << ": " << httplib::to_string(r.error());
    EXPECT_EQ(r->status, 200) << path;
    EXPECT_LT(took, absl::Milliseconds(100)) << path;
    std::printf("  GET %-12s -> %d in %.2f ms with 64 slow clients (bound 100 ms)\n", path,
                r->status, absl::ToDoubleMilliseconds(took));
  }
  const int fd = switchyard::testing::ConnectFrom("127.0.0.2", server_->http_port());
  ASSERT_GE(fd, 0);
  switchyard::testing::RawResponse refused =
      switchyard::testing::ReadResponse(fd, absl::Seconds(20));
  close(fd);
  std::printf("  connection %d from 127.0.0.2 -> %d %s\n", cap + 1, refused.status,
              refused.body.c_str());
  EXPECT_EQ(refused.status, 503);
  Json json = Json::parse(refused.body, nullptr, false);
  EXPECT_EQ(json["error"]["status"], "UNAVAILABLE") << refused.body;
  EXPECT_EQ(attack.closed(), 0) << "the slow clients are held until request_timeout";
}

// The same attack over HTTPS: 64 connections from 127.0.0.2..5 each send a ClientHello one byte
// at a time, stalling their handshakes; a client from 127.0.0.1 still completes its handshake
// and gets /healthz, /metrics and an authenticated GET /v1/jobs/1, each within 100 ms.
TEST_F(RestGatewayTest, SlowClientHellosDoNotStarveHttps) {
  if (std::system("command -v openssl > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "openssl is not installed: cannot make a test certificate";
  }
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = tmp != nullptr ? tmp : "/tmp";
  const std::string cert = dir + "/rest_tls_cert.pem", key = dir + "/rest_tls_key.pem";
  const std::string cmd =
      absl::StrCat("openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost ",
                   "-keyout ", key, " -out ", cert, " > /dev/null 2>&1");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  server_ = testing::StartServer("rest_tls_slowloris.db", [&](ServerOptions& o) {
    o.tls_cert_file = cert;
    o.tls_key_file = key;
    o.workers = false;
  });
  ASSERT_NE(server_, nullptr);
  ASSERT_TRUE(server_->tls());
  httplib::SSLClient setup("127.0.0.1", server_->http_port());
  setup.enable_server_certificate_verification(false);
  auto created = setup.Post("/v1/jobs", Auth(), CreateBody("held"), "application/json");
  ASSERT_TRUE(created) << httplib::to_string(created.error());
  ASSERT_EQ(created->status, 200) << created->body;
  const std::string hello =
      std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11) + std::string(500, 'r');
  switchyard::testing::SlowClients attack(server_->http_port(), 64, /*first_host=*/2,
                                          /*hosts=*/4, hello, absl::Milliseconds(200));
  ASSERT_EQ(attack.connected(), 64);
  absl::SleepFor(absl::Milliseconds(600));
  const std::pair<const char*, httplib::Headers> calls[] = {
      {"/healthz", {}}, {"/metrics", {}}, {"/v1/jobs/1", Auth()}};
  for (const auto& [path, headers] : calls) {
    httplib::SSLClient fresh("127.0.0.1", server_->http_port());
    fresh.enable_server_certificate_verification(false);
    fresh.set_keep_alive(false);
    const absl::Time start = absl::Now();
    httplib::Result r = fresh.Get(path, headers);
    const absl::Duration took = absl::Now() - start;
    ASSERT_TRUE(r) << path << ": " << httplib::to_string(r.error());
    EXPECT_EQ(r->status, 200) << path;
    EXPECT_LT(took, absl::Milliseconds(100)) << path;
    std::printf("  HTTPS GET %-12s -> %d in %.2f ms with 64 stalled handshakes (bound 100 ms)\n",
                path, r->status, absl::ToDoubleMilliseconds(took));
  }
  EXPECT_EQ(attack.closed(), 0) << "the stalled handshakes are held until request_timeout";
}

// "name{labels} value" samples of a text exposition.
std::map<std::string, double> Samples(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    out[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  return out;
}

TEST_F(RestGatewayTest, MetricsScrape) {
  Start("rest_metrics.db");
  for (int i = 0; i < 4; ++i) ASSERT_EQ(Call("POST", "/v1/jobs", CreateBody("m")).first, 200);
  ASSERT_EQ(Call("POST", "/v1/jobs/1:cancel").first, 200);
  Call("GET", "/v1/jobs/9");
  Call("GET", "/v1/jobs", "", "bad");
  jobs::JobHub* hub = server_->hub();
  ASSERT_TRUE(hub->Transition("jobs/2", v1::Job::STARTING, "TEST").ok());
  ASSERT_TRUE(hub->Transition("jobs/2", v1::Job::RESTARTING, "WORKER_LOST").ok());
  ASSERT_TRUE(hub->Transition("jobs/3", v1::Job::STARTING, "TEST").ok());
  ASSERT_TRUE(hub->Transition("jobs/3", v1::Job::RUNNING, "TEST").ok());

  auto r = client_->Get("/metrics");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  EXPECT_TRUE(absl::StartsWith(r->get_header_value("Content-Type"), "text/plain; version=0.0.4"));
  std::printf("%s", r->body.c_str());
  std::map<std::string, double> s = Samples(r->body);
  EXPECT_EQ(s["switchyard_coordinator_jobs{state=\"PENDING\"}"], 1);
  EXPECT_EQ(s["switchyard_coordinator_jobs{state=\"CANCELLED\"}"], 1);
  EXPECT_EQ(s["switchyard_coordinator_jobs{state=\"RESTARTING\"}"], 1);
  EXPECT_EQ(s["switchyard_coordinator_jobs{state=\"RUNNING\"}"], 1);
  EXPECT_EQ(s["switchyard_coordinator_jobs{state=\"SUCCEEDED\"}"], 0);
  EXPECT_EQ(s["switchyard_coordinator_job_restarts_total"], 1);
  EXPECT_EQ(s["switchyard_coordinator_workers_attached"], 0);  // none attached (workers test: 2)
  EXPECT_EQ(
      s["switchyard_coordinator_rpc_duration_seconds_count{code=\"OK\",method=\"CreateJob\"}"], 4);
  EXPECT_EQ(
      s["switchyard_coordinator_rpc_duration_seconds_count{code=\"OK\",method=\"CancelJob\"}"], 1);
  EXPECT_EQ(s["switchyard_coordinator_rpc_duration_seconds_count{code=\"NOT_FOUND\",method="
              "\"GetJob\"}"],
            1);
  EXPECT_EQ(s["switchyard_coordinator_rpc_duration_seconds_count{code=\"UNAUTHENTICATED\","
              "method=\"ListJobs\"}"],
            1);
  EXPECT_GT(s["switchyard_coordinator_rpc_duration_seconds_sum{code=\"OK\",method=\"CreateJob\"}"],
            0);
}

}  // namespace
}  // namespace switchyard::api
