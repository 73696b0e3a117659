// The processes of the inference agent tests besides the test itself, and
// the byte pattern they agree on.
//
//   writer PROVIDER NICS NODE SPLIT   a trainer stand-in using the transport
//                                     engine directly; commands on stdin:
//     desc HEX                        import the agent's region descriptor
//     plan OFF:BYTES ...              the writes of one version, in plan order
//     write V SEED I,J,...            write plan entries I,J,... of version V
//                                     (PatternByte bytes, imm = V), wait
//                                     for their local completion; "done"
//   engine SHM V SEED TIMEOUT_MS NAME:OFF:BYTES ...
//                                     an inference engine: maps the store with
//                                     EngineView, waits until complete_version
//                                     is V, checks each named tensor against
//                                     PatternByte; prints "ok" or what differs
//   peek SHM                          prints "complete C failed F"
//   agent KEY=VALUE ...               `wsync inference-agent` (agent_command.h)
//                                     with flags controller= rank= layout=
//                                     provider= nics= shm= version_timeout=
#pragma once

#include <cstdint>

namespace wsync::inference::testing {

// The byte version `v` of the weights holds at region offset `offset`: a
// hash, so every version differs everywhere and nothing can pass by luck.
inline uint8_t PatternByte(uint64_t seed, uint64_t v, uint64_t offset) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + v * 0xbf58476d1ce4e5b9ull + (offset >> 3);
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return static_cast<uint8_t>(x >> (8 * (offset & 7)));
}

int WriterMain(int argc, char** argv);
int EngineMain(int argc, char** argv);
int PeekMain(int argc, char** argv);
int AgentMain(int argc, char** argv);

}  // namespace wsync::inference::testing
