// File: cli/k8s_workers_test.cc
//
// The manifest of `syctl k8s-workers` for fixture jobs, parsed back with yaml-cpp: the Indexed
// Job's size is the scheduler's worker minimum, and the checkpoint volume is mounted only with a
// subPath (the job's own directory read-write, the loaded job's read-only). The end-to-end use
// (real coordinator, kubectl, a real worker running the manifest's args) is //deploy:deploy_test.
#include "cli/k8s_workers.h"

#include <cstdio>
#include <string>
#include <vector>

#include "coordinator/jobs/placement.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "yaml-cpp/yaml.h"

namespace switchyard::cli {
namespace {

using ::testing::HasSubstr;

v1::Job FixtureJob(int64_t id, const std::string& load) {
  v1::Job job;
  job.set_name("jobs/" + std::to_string(id));
  job.set_state(v1::Job::PENDING);
  job.mutable_spec()->set_min_workers(3);
  job.mutable_spec()->set_max_workers(4);
  job.mutable_spec()->mutable_training()->set_load(load);
  return job;
}

struct Mount {
  std::string name, path, sub_path;
  bool read_only = false;
};

std::vector<Mount> Mounts(const YAML::Node& doc) {
  std::vector<Mount> out;
  for (const YAML::Node& m : doc["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]) {
    out.push_back({m["name"].as<std::string>(), m["mountPath"].as<std::string>(),
                   m["subPath"] ? m["subPath"].as<std::string>() : "",
                   m["readOnly"] && m["readOnly"].as<bool>()});
  }
  return out;
}

TEST(K8sWorkersTest, IndexedJobOfTheWorkersNeededWithTheJobsDirectoryOnly) {
  absl::StatusOr<std::string> text = K8sWorkersManifest(FixtureJob(7, ""), {});
  ASSERT_TRUE(text.ok()) << text.status();
  std::printf("%s", text->c_str());
  const YAML::Node doc = YAML::Load(*text);
  EXPECT_EQ(doc["apiVersion"].as<std::string>(), "batch/v1");
  EXPECT_EQ(doc["kind"].as<std::string>(), "Job");
  EXPECT_EQ(doc["metadata"]["namespace"].as<std::string>(), "switchyard");
  EXPECT_EQ(doc["spec"]["completionMode"].as<std::string>(), "Indexed");
  EXPECT_EQ(doc["spec"]["completions"].as<int>(), 3);
  EXPECT_EQ(doc["spec"]["parallelism"].as<int>(), 3);
  const YAML::Node pod = doc["spec"]["template"]["spec"];
  // Never (was OnFailure): Kubernetes accepts a podFailurePolicy only with Never.
  EXPECT_EQ(pod["restartPolicy"].as<std::string>(), "Never");
  // DESIGN.md: exit 1-127 is permanent: the Job fails at once rather than retrying the pod.
  const YAML::Node rules = doc["spec"]["podFailurePolicy"]["rules"];
  ASSERT_TRUE(rules.IsSequence());
  ASSERT_GE(rules.size(), 1u);
  EXPECT_EQ(rules[0]["action"].as<std::string>(), "FailJob");
  EXPECT_EQ(rules[0]["onExitCodes"]["containerName"].as<std::string>(), "worker");
  EXPECT_EQ(rules[0]["onExitCodes"]["operator"].as<std::string>(), "In");
  const std::vector<int> codes = rules[0]["onExitCodes"]["values"].as<std::vector<int>>();
  std::vector<int> permanent;
  for (int code = 1; code <= 127; ++code) permanent.push_back(code);
  EXPECT_EQ(codes, permanent);
  // Exit 0 and the retryable 128-255 match no FailJob rule: they stay with backoffLimit.
  for (const YAML::Node& rule : rules) {
    if (rule["action"].as<std::string>() != "FailJob" || !rule["onExitCodes"]) continue;
    for (int code : rule["onExitCodes"]["values"].as<std::vector<int>>()) {
      EXPECT_TRUE(code >= 1 && code <= 127) << "FailJob on retryable exit " << code;
    }
  }
  const YAML::Node c = pod["containers"][0];
  EXPECT_EQ(c["resources"]["limits"]["nvidia.com/gpu"].as<int>(), 1);
  std::vector<std::string> args = c["args"].as<std::vector<std::string>>();
  EXPECT_THAT(args, ::testing::Contains("--job=jobs/7"));
  EXPECT_THAT(args, ::testing::Contains("--checkpoint-root=/checkpoints"));
  int checkpoint_mounts = 0;
  for (const Mount& m : Mounts(doc)) {
    std::printf("mount %s at %s subPath '%s'%s\n", m.name.c_str(), m.path.c_str(),
                m.sub_path.c_str(), m.read_only ? " readOnly" : "");
    if (m.name != "checkpoints") continue;
    ++checkpoint_mounts;
    EXPECT_EQ(m.sub_path, "jobs/7");
    EXPECT_EQ(m.path, "/checkpoints/jobs/7");
    EXPECT_FALSE(m.read_only);
  }
  EXPECT_EQ(checkpoint_mounts, 1);
}

// The pod runs as the image's non-root user with a read-only root file system; the only
// writable places are its mounts (the job's directory, /dev/shm, an emptyDir /tmp).
TEST(K8sWorkersTest, WorkerPodIsNonRootWithReadOnlyRootFilesystem) {
  absl::StatusOr<std::string> text = K8sWorkersManifest(FixtureJob(7, ""), {});
  ASSERT_TRUE(text.ok()) << text.status();
  const YAML::Node pod = YAML::Load(*text)["spec"]["template"]["spec"];
  EXPECT_TRUE(pod["securityContext"]["runAsNonRoot"].as<bool>());
  EXPECT_EQ(pod["securityContext"]["runAsUser"].as<int>(), 10001);
  const YAML::Node sc = pod["containers"][0]["securityContext"];
  EXPECT_FALSE(sc["allowPrivilegeEscalation"].as<bool>());
  EXPECT_TRUE(sc["readOnlyRootFilesystem"].as<bool>());
  EXPECT_EQ(sc["capabilities"]["drop"][0].as<std::string>(), "ALL");
  bool tmp_mounted = false;
  for (const YAML::Node& m : pod["containers"][0]["volumeMounts"]) {
    if (m["mountPath"].as<std::string>() == "/tmp")
      tmp_mounted = m["name"].as<std::string>() == "tmp";
  }
  EXPECT_TRUE(tmp_mounted);
  bool tmp_is_empty_dir = false;
  for (const YAML::Node& v : pod["volumes"]) {
    if (v["name"].as<std::string>() == "tmp") tmp_is_empty_dir = static_cast<bool>(v["emptyDir"]);
  }
  EXPECT_TRUE(tmp_is_empty_dir);
}

TEST(K8sWorkersTest, LoadedJobIsMountedReadOnly) {
  for (const std::string load : {"jobs/3", "jobs/3/step_600", "jobs/3/run/step_2"}) {
    absl::StatusOr<std::string> text = K8sWorkersManifest(FixtureJob(8, load), {});
    ASSERT_TRUE(text.ok()) << text.status();
    std::vector<Mount> ckpt;
    for (const Mount& m : Mounts(YAML::Load(*text))) {
      if (m.name == "checkpoints") ckpt.push_back(m);
    }
    std::printf("load %s: %zu checkpoint mounts\n", load.c_str(), ckpt.size());
    ASSERT_EQ(ckpt.size(), 2u);
    EXPECT_EQ(ckpt[0].sub_path, "jobs/8");
    EXPECT_FALSE(ckpt[0].read_only);
    EXPECT_EQ(ckpt[1].sub_path, "jobs/3");
    EXPECT_EQ(ckpt[1].path, "/checkpoints/jobs/3");
    EXPECT_TRUE(ckpt[1].read_only);
  }
  // Its own checkpoints (load = itself) need no second mount.
  absl::StatusOr<std::string> self = K8sWorkersManifest(FixtureJob(8, "jobs/8/step_5"), {});
  ASSERT_TRUE(self.ok());
  int n = 0;
  for (const Mount& m : Mounts(YAML::Load(*self))) n += m.name == "checkpoints";
  EXPECT_EQ(n, 1);
}

TEST(K8sWorkersTest, PodsAreTheSchedulersMinimum) {
  std::vector<v1::JobSpec> specs(4);
  specs[1].set_min_workers(2);
  specs[2].mutable_parallel()->set_world_size(5);
  specs[3].mutable_parallel()->set_world_size(5);
  specs[3].set_min_workers(4);
  for (const v1::JobSpec& spec : specs) {
    v1::Job job = FixtureJob(9, "");
    *job.mutable_spec() = spec;
    absl::StatusOr<std::string> text = K8sWorkersManifest(job, {});
    ASSERT_TRUE(text.ok()) << text.status();
    const int pods = YAML::Load(*text)["spec"]["completions"].as<int>();
    std::printf("min_workers %d world_size %d: %d pod(s) (scheduler waits for %d)\n",
                spec.min_workers(), spec.parallel().world_size(), pods,
                jobs::WorkerRange(spec).first);
    EXPECT_EQ(pods, jobs::WorkerRange(spec).first);
  }
}

// A load the coordinator refuses is refused here too (one parser, LoadedJobName): the copy this
// replaces took "jobs/3/../4" as job 3 and mounted it.
TEST(K8sWorkersTest, LoadBreakingThePathRulesIsRefused) {
  for (const std::string load : {"jobs/3/../4", "/checkpoints/jobs/3", "other/3", "jobs/x"}) {
    absl::StatusOr<std::string> text = K8sWorkersManifest(FixtureJob(8, load), {});
    std::printf("load %s: %s\n", load.c_str(), text.status().ToString().c_str());
    ASSERT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument) << load;
    EXPECT_THAT(std::string(text.status().message()), HasSubstr("training.load"));
  }
}

TEST(K8sWorkersTest, BadInputIsRefusedNamingTheOption) {
  K8sWorkersOptions bad_ns;
  bad_ns.k8s_namespace = "Not_A_Label";
  EXPECT_EQ(K8sWorkersManifest(FixtureJob(1, ""), bad_ns).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(K8sWorkersManifest(FixtureJob(1, ""), bad_ns).status().message()),
              HasSubstr("--namespace"));
  K8sWorkersOptions bad_image;
  bad_image.image = "img\n  evil: true";
  EXPECT_THAT(std::string(K8sWorkersManifest(FixtureJob(1, ""), bad_image).status().message()),
              HasSubstr("--image"));
  K8sWorkersOptions bad_address;
  bad_address.coordinator_address = "no-port";
  EXPECT_THAT(std::string(K8sWorkersManifest(FixtureJob(1, ""), bad_address).status().message()),
              HasSubstr("--coordinator-address"));
  EXPECT_THAT(std::string(K8sWorkersManifest(FixtureJob(1, "/etc"), {}).status().message()),
              HasSubstr("training.load"));
  v1::Job done = FixtureJob(1, "");
  done.set_state(v1::Job::SUCCEEDED);
  EXPECT_EQ(K8sWorkersManifest(done, {}).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace switchyard::cli
