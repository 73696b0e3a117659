// Clang thread-safety annotations (ABSL_GUARDED_BY style) without Abseil.
// They document which mutex guards what; with clang and
// -Wthread-safety they are also checked. GCC ignores them.
#pragma once

#if defined(__clang__)
#define WSYNC_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define WSYNC_THREAD_ANNOTATION(x)
#endif

#define WSYNC_GUARDED_BY(x) WSYNC_THREAD_ANNOTATION(guarded_by(x))
#define WSYNC_REQUIRES(...) WSYNC_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define WSYNC_EXCLUDES(...) WSYNC_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
