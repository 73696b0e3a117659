// Timeouts a test gives the system under test (how long a collective, a
// heartbeat or a version may take) are not assertions on speed: they only
// have to be long enough for a loaded machine. Under sanitizers every one of
// our processes runs several times slower (TSan: 5-15x), and a deployment of
// nine processes on two cores can then miss a 5 s rendezvous that takes
// well under a second in Release. Tests multiply their timeouts by this.
#pragma once

namespace wsync::testing {

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
inline constexpr double kSanitizerSlowdown = 4;
#else
inline constexpr double kSanitizerSlowdown = 1;
#endif

}  // namespace wsync::testing
