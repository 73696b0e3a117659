// inference_agent_test: the gtest binary, and (argv[1] = writer | engine |
// peek | agent) the other processes its tests start (test_roles.h).
#include <cstring>

#include <gtest/gtest.h>

#include "tests/inference_agent/test_roles.h"

int main(int argc, char** argv) {
  using namespace wsync::inference::testing;
  if (argc >= 2 && std::strcmp(argv[1], "writer") == 0) return WriterMain(argc, argv);
  if (argc >= 2 && std::strcmp(argv[1], "engine") == 0) return EngineMain(argc, argv);
  if (argc >= 2 && std::strcmp(argv[1], "peek") == 0) return PeekMain(argc, argv);
  if (argc >= 2 && std::strcmp(argv[1], "agent") == 0) return AgentMain(argc, argv);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
