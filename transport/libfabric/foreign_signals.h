// Debian's and Ubuntu's libfabric link the PSM provider's libinfinipath,
// whose constructor takes SIGINT, SIGTERM, SIGABRT, SIGSEGV, SIGBUS and
// SIGILL the moment libfabric is loaded: its handler writes a backtrace file
// (`<exe>.80s-<pid>,<host>.btr`, in the working directory) and then calls
// exit() from inside the handler. A Ctrl-C or a SIGTERM then runs every
// atexit handler and static destructor while the process's threads still
// run: OpenSSL freed under a heartbeat thread that signs a request
// (SIGSEGV), a Python interpreter finalized under its own threads
// (std::terminate: a vLLM worker told to stop), Ctrl-C never reaching
// Python as KeyboardInterrupt.
#pragma once

namespace wsync::transport::fabric {

// Gives each of those signals back to its default action wherever
// libinfinipath's handler holds it (handlers of anyone else are left
// alone). Idempotent; called at the start of `wsync` and by every engine
// creation. The Python package sets IPATH_NO_BACKTRACE=1 before loading
// libfabric, which keeps the handlers from being installed at all.
void ReleaseSignalsFromInfinipath();

}  // namespace wsync::transport::fabric
