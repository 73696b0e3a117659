#include "transport/libfabric/foreign_signals.h"

#include <dlfcn.h>

#include <csignal>
#include <cstring>
#include <initializer_list>

namespace wsync::transport::fabric {

void ReleaseSignalsFromInfinipath() {
  for (int sig : {SIGINT, SIGTERM, SIGABRT, SIGSEGV, SIGBUS, SIGILL}) {
    struct sigaction current {};
    if (sigaction(sig, nullptr, &current) != 0) continue;
    const void* handler = (current.sa_flags & SA_SIGINFO) ? reinterpret_cast<const void*>(current.sa_sigaction)
                                                          : reinterpret_cast<const void*>(current.sa_handler);
    if (handler == reinterpret_cast<const void*>(SIG_DFL) || handler == reinterpret_cast<const void*>(SIG_IGN)) {
      continue;
    }
    Dl_info where{};
    if (dladdr(handler, &where) == 0 || where.dli_fname == nullptr) continue;
    if (std::strstr(where.dli_fname, "libinfinipath") == nullptr) continue;
    struct sigaction fallback {};
    fallback.sa_handler = SIG_DFL;
    sigemptyset(&fallback.sa_mask);
    sigaction(sig, &fallback, nullptr);
  }
}

}  // namespace wsync::transport::fabric
