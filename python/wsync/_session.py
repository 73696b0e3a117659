"""What both agents share: a C++ session that close() (or leaving a `with`
block, or the interpreter exiting) ends once."""

import atexit
import weakref

# Sessions still open. Their C++ threads (heartbeats, the inference loop)
# sign requests with OpenSSL, and OpenSSL frees its locks in a C atexit
# handler: a thread signing while the process exits then dies on a freed
# lock (SIGSEGV in RAND_bytes, seen at vLLM worker shutdown). Python's
# atexit runs before C's, so sessions left open are closed there.
_open = weakref.WeakSet()


@atexit.register
def _close_all():
    for owner in list(_open):
        owner.close()


class SessionOwner:
    _session = None

    def _opened(self, session):
        """Takes `session` (a _C session) as this owner's."""
        self._session = session
        _open.add(self)

    def close(self):
        """Ends the session: waits for work in flight, then closes the
        transport. Idempotent."""
        _open.discard(self)
        if self._session is not None:
            self._session.close()
            self._session = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
