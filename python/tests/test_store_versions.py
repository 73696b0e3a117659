"""wsync.StoreVersions, the engine's view of a sidecar's version words, while
the agent copies a version in from its shadow (--shadow, or host staging of
GPU weights): the weights are a mix then, but the version is not failed, so
an engine waiting for it must wait on. The words are written here at the
offsets the C++ header pins (inference_agent/weight_store_format.h's
static_asserts), as the agent stores them, in the agent's order."""
import os
import threading
import time

import pytest

import wsync

NONE = (1 << 64) - 1
MAGIC, COMPLETE, FAILED, COMMITTING = 0, 128, 144, 160


class FakeStore:
    def __init__(self, name):
        self.path = "/dev/shm/" + name
        with open(self.path, "wb") as f:
            f.write(b"\0" * 4096)
        for at in (COMPLETE, FAILED, COMMITTING):
            self.set(at, NONE)
        self.set(MAGIC, 0x31574E4943595357)

    def set(self, at, value):
        with open(self.path, "r+b") as f:
            f.seek(at)
            f.write(value.to_bytes(8, "little"))

    def remove(self):
        os.unlink(self.path)


@pytest.fixture
def store():
    s = FakeStore(f"wsync-test-versions-{os.getpid()}")
    yield s
    s.remove()


def wait_in_thread(versions, v):
    out = {}

    def run():
        try:
            versions.wait_version(v, timeout=30)
            out["result"] = "complete"
        except wsync.VersionError as e:
            out["result"] = f"failed: {e}"

    t = threading.Thread(target=run)
    t.start()
    return t, out


def test_a_version_being_copied_in_is_waited_for_until_complete(store):
    versions = wsync.StoreVersions(os.path.basename(store.path))
    store.set(COMMITTING, 1)  # MarkCommitting(1): the committing word first,
    store.set(FAILED, 1)      # then the failed word (the bytes are a mix)
    t, out = wait_in_thread(versions, 1)
    time.sleep(0.2)           # the waiter sees the copy in progress
    assert t.is_alive(), out
    assert versions.committing_version == 1
    store.set(COMPLETE, 1)    # MarkComplete(1)
    t.join(10)
    assert out == {"result": "complete"}


def test_a_copy_that_fails_fails_the_waiter(store):
    versions = wsync.StoreVersions(os.path.basename(store.path))
    store.set(COMMITTING, 2)
    store.set(FAILED, 2)
    t, out = wait_in_thread(versions, 2)
    time.sleep(0.2)
    assert t.is_alive(), out
    store.set(COMMITTING, NONE)  # MarkFailed(2) clears the word
    t.join(10)
    assert out.get("result", "").startswith("failed"), out


def test_a_failed_version_without_a_copy_fails_at_once(store):
    versions = wsync.StoreVersions(os.path.basename(store.path))
    store.set(FAILED, 3)
    with pytest.raises(wsync.VersionError):
        versions.wait_version(3, timeout=5)


# Engine-paced sidecars (`wsync inference-agent --paced`): the engine's ask
# and the agent's answer, at the offsets weight_store_format.h pins. A thread
# plays the agent: it reads the ask and answers in the agent's order (result,
# code, message, then the done word).
ASK, ASK_VERSION, ASK_TIMEOUT, DONE, RESULT, CODE, MESSAGE = 192, 200, 208, 256, 264, 272, 280


def get(store, at):
    with open(store.path, "rb") as f:
        f.seek(at)
        return int.from_bytes(f.read(8), "little")


def answer_next_ask(store, result, code, message=b""):
    def run():
        deadline = time.monotonic() + 10
        while get(store, ASK) == get(store, DONE):
            assert time.monotonic() < deadline
            time.sleep(0.001)
        asks.append((get(store, ASK), get(store, ASK_VERSION), get(store, ASK_TIMEOUT)))
        store.set(RESULT, result)
        store.set(CODE, code)
        with open(store.path, "r+b") as f:
            f.seek(MESSAGE)
            f.write(message + b"\0")
        store.set(DONE, get(store, ASK))
    asks = []
    t = threading.Thread(target=run)
    t.start()
    return t, asks


def test_update_asks_the_agent_and_says_what_it_answered(store):
    versions = wsync.StoreVersions(os.path.basename(store.path))
    t, asks = answer_next_ask(store, 4, 0)
    assert versions.update(timeout=5) == 4
    t.join()
    assert asks == [(1, 0, 5000)], "one ask: sequence 1, the newest version, 5 s"

    t, asks = answer_next_ask(store, 4, 1, b"inference rank 0: version 5 failed: trainer rank 1: killed")
    with pytest.raises(wsync.VersionError, match="version 5 failed: trainer rank 1: killed"):
        versions.update(5, timeout=5)
    t.join()
    assert asks == [(2, 5, 5000)]

    t, asks = answer_next_ask(store, 4, 2, b"no version 6 by the deadline")
    with pytest.raises(TimeoutError, match="no version 6 by the deadline"):
        versions.update(6, timeout=1)
    t.join()
    with pytest.raises(ValueError):
        versions.update(0)
