"""What both agents share: a C++ session that close() (or leaving a `with`
block) ends once."""


class SessionOwner:
    _session = None

    def close(self):
        """Ends the session: waits for work in flight, then closes the
        transport. Idempotent."""
        if self._session is not None:
            self._session.close()
            self._session = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
