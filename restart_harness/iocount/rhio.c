/* rhio: per-process counters of the I/O a process does on the files under a few path prefixes (the checkpoint
 * directory), loaded with LD_PRELOAD into every rank. For each such file it counts read and write calls, bytes,
 * request sizes (power-of-two histogram), seconds inside the calls, and fsyncs; for the process it also keeps the
 * wall time during which at least one read (write, sync) call was in flight on any thread, so that concurrent I/O is
 * not counted twice. Python reads the counters through ctypes (restart_harness/iocount/__init__.py).
 *
 * What it sees: open/openat/creat and fopen (both 64-bit spellings), read/pread/readv/preadv, write/pwrite/writev/
 * pwritev, fread/fwrite, fsync/fdatasync, close/fclose, called through the dynamic linker (every library's PLT,
 * Python's and libtorch's included), and libaio's io_submit/io_getevents/io_pgetevents (DeepSpeed's async_io op, FastPersist):
 * an asynchronous read or write is one call from its submission until io_getevents reaps it, so its seconds are
 * the request's latency and it is in flight all that time. What it cannot see: I/O submitted through io_uring,
 * memory-mapped file access, and calls glibc makes to itself (fread's internal read is counted once, as the fread).
 *
 * Sources (RH_IO_SOURCES="name=/prefix:/prefix;name=/prefix..."): besides the checkpoint's files, every path the
 * process opens, stats or lists is put in the source whose prefix is the longest to match it (the Python environment,
 * the extension cache, the checkpoint, the system's libraries, ...; source 0, `other`, takes the rest), and per source
 * it counts opens (and those that failed), metadata calls (the stat family, access, readlink; and those that failed),
 * directory listings (opendir), and the read and write calls and bytes on the descriptors those opens returned. A
 * path relative to a directory descriptor takes that descriptor's source. A source written `name+=...` also takes
 * the folders above its prefixes, before any other source's prefix does (path resolution stats every component of
 * a path: Python's realpath on the environment's files stats /home, /home/user, ...; a copy in /dev/shm: /dev). The dynamic loader's own opens and maps
 * (shared libraries) do not go through these functions: Python reads them from /proc/self/maps
 * (restart_harness/worker/io_marks.py).
 *
 * RH_IO_FOPEN_VIA_OPEN=1 makes fopen of a tracked file an open() plus fdopen(): the same file, mode and stream,
 * but a POSIX tracer below this library (dftracer 2.2.0) then learns the descriptor and sees the writes that
 * libstdc++'s ofstream (torch.save) makes on it. */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <linux/aio_abi.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define RH_MAX_FD 65536
#define RH_MAX_FILES 8192
#define RH_MAX_PREFIXES 8
#define RH_HIST 24 /* bucket b counts requests of [2^(b+9), 2^(b+10)) bytes; 0 takes < 1 KiB, 23 takes >= 4 GiB */
enum { RH_READ = 0, RH_WRITE = 1, RH_SYNC = 2, RH_CLASSES = 3 };

typedef struct {
    char path[PATH_MAX];
    uint64_t opens, calls[RH_CLASSES], bytes[RH_CLASSES], ns[RH_CLASSES];
    uint64_t hist[2][RH_HIST];
} rh_file_t;

typedef struct {
    uint64_t calls[RH_CLASSES], bytes[RH_CLASSES], ns[RH_CLASSES], busy_ns[RH_CLASSES], opens, files;
} rh_totals_t;

static rh_file_t rh_files[RH_MAX_FILES];
static int rh_nfiles;
static int rh_fd_file[RH_MAX_FD]; /* file index + 1; 0 = not tracked */
static char rh_prefix[RH_MAX_PREFIXES][PATH_MAX];
static int rh_nprefix;
static int rh_fopen_via_open;
static rh_totals_t rh_total;
static int rh_inflight[RH_CLASSES];
static uint64_t rh_busy_since[RH_CLASSES];
static pthread_mutex_t rh_lock = PTHREAD_MUTEX_INITIALIZER;

/* ---- sources ---- */
#define RH_MAX_SOURCES 16
#define RH_MAX_SOURCE_PREFIXES 64
#define RH_SOURCE_NAME 32
enum { RH_S_OPENS, RH_S_OPEN_FAILURES, RH_S_STATS, RH_S_STAT_FAILURES, RH_S_LISTINGS, RH_S_READS, RH_S_READ_BYTES,
       RH_S_WRITES, RH_S_WRITE_BYTES, RH_S_FIELDS };
static uint64_t rh_src[RH_MAX_SOURCES][RH_S_FIELDS]; /* updated with atomic adds: no lock on the import path */
static char rh_src_name[RH_MAX_SOURCES][RH_SOURCE_NAME] = {"other"};
static int rh_nsrc = 1;
static char rh_src_prefix[RH_MAX_SOURCE_PREFIXES][PATH_MAX];
static size_t rh_src_prefix_len[RH_MAX_SOURCE_PREFIXES];
static int rh_src_prefix_source[RH_MAX_SOURCE_PREFIXES];
static int rh_src_ancestors[RH_MAX_SOURCES]; /* the source also takes the folders above its prefixes */
static int rh_nsrc_prefix;
static unsigned char rh_fd_source[RH_MAX_FD]; /* source + 1 of the path the descriptor was opened on; 0 = unknown */

static int (*real_open)(const char *, int, ...);
static int (*real_open64)(const char *, int, ...);
static int (*real_openat)(int, const char *, int, ...);
static int (*real_openat64)(int, const char *, int, ...);
static int (*real_creat)(const char *, mode_t);
static int (*real_close)(int);
static FILE *(*real_fopen)(const char *, const char *);
static FILE *(*real_fopen64)(const char *, const char *);
static int (*real_fclose)(FILE *);
static ssize_t (*real_read)(int, void *, size_t);
static ssize_t (*real_pread)(int, void *, size_t, off_t);
static ssize_t (*real_pread64)(int, void *, size_t, off_t);
static ssize_t (*real_readv)(int, const struct iovec *, int);
static ssize_t (*real_preadv)(int, const struct iovec *, int, off_t);
/* what callers built with 64-bit file offsets (CPython's os.preadv/os.pwritev among them) actually call */
static ssize_t (*real_preadv64)(int, const struct iovec *, int, off_t);
static ssize_t (*real_preadv2)(int, const struct iovec *, int, off_t, int);
static ssize_t (*real_preadv64v2)(int, const struct iovec *, int, off_t, int);
static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static ssize_t (*real_pwrite64)(int, const void *, size_t, off_t);
static ssize_t (*real_writev)(int, const struct iovec *, int);
static ssize_t (*real_pwritev)(int, const struct iovec *, int, off_t);
static ssize_t (*real_pwritev64)(int, const struct iovec *, int, off_t);
static ssize_t (*real_pwritev2)(int, const struct iovec *, int, off_t, int);
static ssize_t (*real_pwritev64v2)(int, const struct iovec *, int, off_t, int);
static size_t (*real_fread)(void *, size_t, size_t, FILE *);
static size_t (*real_fwrite)(const void *, size_t, size_t, FILE *);
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);

/* The real functions come from libc's own handle, not dlsym(RTLD_NEXT): a GOT-patching tracer loaded beside this
 * library (dftracer's gotcha) answers RTLD_NEXT look-ups with its own wrappers, which would call back into here. */
static void *rh_libc;
static void *libc_symbol(const char *name) {
    if (!rh_libc) rh_libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
    void *f = rh_libc ? dlsym(rh_libc, name) : NULL;
    return f ? f : dlsym(RTLD_NEXT, name);
}
#define RESOLVE(name) \
    do { if (!real_##name) real_##name = libc_symbol(#name); } while (0)

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void add_prefixes(const char *list) {
    char buf[RH_MAX_PREFIXES * PATH_MAX];
    if (!list) return;
    strncpy(buf, list, sizeof buf - 1);
    buf[sizeof buf - 1] = 0;
    for (char *save = NULL, *p = strtok_r(buf, ":", &save); p && rh_nprefix < RH_MAX_PREFIXES;
         p = strtok_r(NULL, ":", &save)) {
        if (p[0] != '/') continue;
        strncpy(rh_prefix[rh_nprefix], p, PATH_MAX - 1);
        rh_nprefix++;
    }
}

/* RH_IO_SOURCES: `name=/a:/b;name2=/c`; a name given twice adds prefixes to the same source. */
static void parse_sources(const char *spec) {
    static char buf[RH_MAX_SOURCE_PREFIXES * 256];
    if (!spec) return;
    strncpy(buf, spec, sizeof buf - 1);
    buf[sizeof buf - 1] = 0;
    for (char *save = NULL, *item = strtok_r(buf, ";", &save); item; item = strtok_r(NULL, ";", &save)) {
        char *eq = strchr(item, '=');
        if (!eq || eq == item) continue;
        *eq = 0;
        int ancestors = eq[-1] == '+';
        if (ancestors) eq[-1] = 0;
        int src = -1;
        for (int i = 0; i < rh_nsrc; i++)
            if (strcmp(rh_src_name[i], item) == 0) src = i;
        if (src < 0) {
            if (rh_nsrc == RH_MAX_SOURCES) continue;
            src = rh_nsrc++;
            strncpy(rh_src_name[src], item, RH_SOURCE_NAME - 1);
        }
        if (ancestors) rh_src_ancestors[src] = 1;
        for (char *s2 = NULL, *p = strtok_r(eq + 1, ":", &s2); p && rh_nsrc_prefix < RH_MAX_SOURCE_PREFIXES;
             p = strtok_r(NULL, ":", &s2)) {
            if (p[0] != '/') continue;
            size_t n = strlen(p);
            while (n > 1 && p[n - 1] == '/') n--; /* "/usr/" and "/usr" are one prefix */
            if (n >= PATH_MAX) continue;
            memcpy(rh_src_prefix[rh_nsrc_prefix], p, n);
            rh_src_prefix[rh_nsrc_prefix][n] = 0;
            rh_src_prefix_len[rh_nsrc_prefix] = n;
            rh_src_prefix_source[rh_nsrc_prefix++] = src;
        }
    }
}

/* The source of an absolute path: the longest prefix that matches whole components ("/" matches everything). */
static int source_of_absolute(const char *path) {
    int best = 0;
    size_t best_len = 0;
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/') len--;
    for (int i = 0; i < rh_nsrc_prefix; i++) /* a folder above a prefix of a source that takes them, wherever it is */
        if (rh_src_ancestors[rh_src_prefix_source[i]] && len < rh_src_prefix_len[i] &&
            strncmp(path, rh_src_prefix[i], len) == 0 && (rh_src_prefix[i][len] == '/' || len == 1))
            return rh_src_prefix_source[i];
    for (int i = 0; i < rh_nsrc_prefix; i++) {
        size_t n = rh_src_prefix_len[i];
        if (n < best_len && best_len) continue;
        if (strncmp(path, rh_src_prefix[i], n) != 0) continue;
        if (!(path[n] == 0 || path[n] == '/' || (n == 1 && path[0] == '/'))) continue;
        if (n >= best_len) { best = rh_src_prefix_source[i]; best_len = n; }
    }
    return best;
}

/* The source of a path given to a call: absolute, relative to the working directory, or relative to dirfd (which
 * then lends it its own source). */
static int source_of(int dirfd, const char *path) {
    if (rh_nsrc_prefix == 0 || !path) return -1;
    if (path[0] == '/') return source_of_absolute(path);
    if (dirfd != AT_FDCWD) {
        if (dirfd >= 0 && dirfd < RH_MAX_FD && rh_fd_source[dirfd]) return rh_fd_source[dirfd] - 1;
        return 0;
    }
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd)) return 0;
    return source_of_absolute(cwd);
}

static void src_add(int src, int field, uint64_t n) {
    if (src >= 0 && src < RH_MAX_SOURCES) __atomic_fetch_add(&rh_src[src][field], n, __ATOMIC_RELAXED);
}

/* An open of `path` (relative to dirfd) returned fd. */
static void source_open(int dirfd, const char *path, int fd) {
    int src = source_of(dirfd, path);
    if (src < 0) return;
    src_add(src, fd >= 0 ? RH_S_OPENS : RH_S_OPEN_FAILURES, 1);
    if (fd >= 0 && fd < RH_MAX_FD) rh_fd_source[fd] = (unsigned char)(src + 1);
}

static void source_stat(int dirfd, const char *path, int result) {
    int src = source_of(dirfd, path);
    if (src < 0) return;
    src_add(src, RH_S_STATS, 1);
    if (result < 0) src_add(src, RH_S_STAT_FAILURES, 1);
}

static void source_io(int fd, int cls, ssize_t bytes) {
    if (fd < 0 || fd >= RH_MAX_FD || !rh_fd_source[fd] || cls == RH_SYNC) return;
    int src = rh_fd_source[fd] - 1;
    src_add(src, cls == RH_READ ? RH_S_READS : RH_S_WRITES, 1);
    if (bytes > 0) src_add(src, cls == RH_READ ? RH_S_READ_BYTES : RH_S_WRITE_BYTES, (uint64_t)bytes);
}

/* RH_IO_SHARED=<file>: every process of a tree (a converter and the worker processes it forks) adds its calls and
 * bytes to one shared record in that file, with atomic adds, so the totals survive processes that end with _exit. */
typedef struct {
    uint64_t calls[RH_CLASSES], bytes[RH_CLASSES], ns[RH_CLASSES], opens;
} rh_shared_t;
static rh_shared_t *rh_shared;

static void map_shared(const char *path) {
    int fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return;
    if (ftruncate(fd, sizeof(rh_shared_t)) == 0) {
        void *p = mmap(NULL, sizeof(rh_shared_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p != MAP_FAILED) rh_shared = p;
    }
    syscall(SYS_close, fd);
}

static void shared_add(int cls, uint64_t ns, ssize_t bytes, int opened) {
    if (!rh_shared) return;
    if (opened) {
        __atomic_fetch_add(&rh_shared->opens, 1, __ATOMIC_RELAXED);
        return;
    }
    __atomic_fetch_add(&rh_shared->calls[cls], 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&rh_shared->ns[cls], ns, __ATOMIC_RELAXED);
    if (bytes > 0) __atomic_fetch_add(&rh_shared->bytes[cls], (uint64_t)bytes, __ATOMIC_RELAXED);
}

__attribute__((constructor)) static void rh_init(void) {
    add_prefixes(getenv("RH_IO_PREFIXES"));
    parse_sources(getenv("RH_IO_SOURCES"));
    const char *v = getenv("RH_IO_FOPEN_VIA_OPEN");
    rh_fopen_via_open = v && v[0] == '1';
    const char *shared = getenv("RH_IO_SHARED");
    if (shared && shared[0] == '/') map_shared(shared);
}

/* Python adds the checkpoint root at run time. */
void rh_io_add_prefix(const char *prefix) {
    pthread_mutex_lock(&rh_lock);
    add_prefixes(prefix);
    pthread_mutex_unlock(&rh_lock);
}

static int tracked_path(const char *path, char *absolute) {
    if (!path || rh_nprefix == 0) return 0;
    if (path[0] == '/') {
        strncpy(absolute, path, PATH_MAX - 1);
        absolute[PATH_MAX - 1] = 0;
    } else {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof cwd)) return 0;
        snprintf(absolute, PATH_MAX, "%s/%s", cwd, path);
    }
    for (int i = 0; i < rh_nprefix; i++) {
        size_t n = strlen(rh_prefix[i]);
        if (strncmp(absolute, rh_prefix[i], n) == 0 && (absolute[n] == 0 || absolute[n] == '/')) return 1;
    }
    return 0;
}

static void track(int fd, const char *path) {
    char absolute[PATH_MAX];
    if (fd < 0 || fd >= RH_MAX_FD || !tracked_path(path, absolute)) return;
    pthread_mutex_lock(&rh_lock);
    int idx = -1;
    for (int i = 0; i < rh_nfiles; i++)
        if (strcmp(rh_files[i].path, absolute) == 0) { idx = i; break; }
    if (idx < 0 && rh_nfiles < RH_MAX_FILES) {
        idx = rh_nfiles++;
        strncpy(rh_files[idx].path, absolute, PATH_MAX - 1);
        rh_total.files++;
    }
    if (idx >= 0) {
        rh_files[idx].opens++;
        rh_total.opens++;
        rh_fd_file[fd] = idx + 1;
    }
    pthread_mutex_unlock(&rh_lock);
    if (idx >= 0) shared_add(0, 0, 0, 1);
}

static int file_of(int fd) { return (fd >= 0 && fd < RH_MAX_FD) ? rh_fd_file[fd] - 1 : -1; }

/* The start of a call on a tracked descriptor: the class becomes busy if nothing of it was in flight. */
static uint64_t begin(int cls) {
    uint64_t t = now_ns();
    pthread_mutex_lock(&rh_lock);
    if (rh_inflight[cls]++ == 0) rh_busy_since[cls] = t;
    pthread_mutex_unlock(&rh_lock);
    return t;
}

static int bucket(uint64_t n) {
    int b = 0;
    for (uint64_t s = n >> 10; s && b < RH_HIST - 1; s >>= 1) b++;
    return b;
}

static void end(int cls, int idx, uint64_t t0, ssize_t bytes) {
    uint64_t t1 = now_ns(), dt = t1 - t0;
    pthread_mutex_lock(&rh_lock);
    if (--rh_inflight[cls] == 0) rh_total.busy_ns[cls] += t1 - rh_busy_since[cls];
    rh_total.calls[cls]++;
    rh_total.ns[cls] += dt;
    if (bytes > 0) rh_total.bytes[cls] += (uint64_t)bytes;
    if (idx >= 0) {
        rh_file_t *f = &rh_files[idx];
        f->calls[cls]++;
        f->ns[cls] += dt;
        if (bytes > 0) f->bytes[cls] += (uint64_t)bytes;
        if (cls != RH_SYNC && bytes >= 0) f->hist[cls][bucket((uint64_t)bytes)]++;
    }
    pthread_mutex_unlock(&rh_lock);
    shared_add(cls, dt, bytes, 0);
}

/* ---- opens and closes --------------------------------------------------------------------------------------- */
static mode_t mode_arg(int flags, va_list ap) {
    return (flags & O_CREAT) || (flags & __O_TMPFILE) == __O_TMPFILE ? (mode_t)va_arg(ap, int) : 0;
}

int open(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    RESOLVE(open);
    int fd = real_open(path, flags, mode);
    source_open(AT_FDCWD, path, fd);
    track(fd, path);
    return fd;
}

int open64(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    RESOLVE(open64);
    int fd = real_open64(path, flags, mode);
    source_open(AT_FDCWD, path, fd);
    track(fd, path);
    return fd;
}

static void track_at(int fd, int dirfd, const char *path) {
    if (fd < 0 || !path) return;
    if (path[0] == '/' || dirfd == AT_FDCWD) {
        track(fd, path);
        return;
    }
    char link[64], dir[PATH_MAX], full[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
    ssize_t n = readlink(link, dir, sizeof dir - 1);
    if (n <= 0) return;
    dir[n] = 0;
    snprintf(full, sizeof full, "%s/%s", dir, path);
    track(fd, full);
}

int openat(int dirfd, const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    RESOLVE(openat);
    int fd = real_openat(dirfd, path, flags, mode);
    source_open(dirfd, path, fd);
    track_at(fd, dirfd, path);
    return fd;
}

int openat64(int dirfd, const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    RESOLVE(openat64);
    int fd = real_openat64(dirfd, path, flags, mode);
    source_open(dirfd, path, fd);
    track_at(fd, dirfd, path);
    return fd;
}

int creat(const char *path, mode_t mode) {
    RESOLVE(creat);
    int fd = real_creat(path, mode);
    source_open(AT_FDCWD, path, fd);
    track(fd, path);
    return fd;
}

static void untrack(int fd) {
    if (fd >= 0 && fd < RH_MAX_FD) {
        rh_fd_file[fd] = 0;
        rh_fd_source[fd] = 0;
    }
}

/* _FORTIFY_SOURCE's spellings of open without a mode (CPython's _Py_open calls __open64_2) */
static int (*real___open_2)(const char *, int);
static int (*real___open64_2)(const char *, int);
static int (*real___openat_2)(int, const char *, int);
static int (*real___openat64_2)(int, const char *, int);
int __open_2(const char *path, int flags) {
    RESOLVE(__open_2);
    int fd = real___open_2(path, flags);
    source_open(AT_FDCWD, path, fd);
    track(fd, path);
    return fd;
}
int __open64_2(const char *path, int flags) {
    RESOLVE(__open64_2);
    int fd = real___open64_2(path, flags);
    source_open(AT_FDCWD, path, fd);
    track(fd, path);
    return fd;
}
int __openat_2(int dirfd, const char *path, int flags) {
    RESOLVE(__openat_2);
    int fd = real___openat_2(dirfd, path, flags);
    source_open(dirfd, path, fd);
    track_at(fd, dirfd, path);
    return fd;
}
int __openat64_2(int dirfd, const char *path, int flags) {
    RESOLVE(__openat64_2);
    int fd = real___openat64_2(dirfd, path, flags);
    source_open(dirfd, path, fd);
    track_at(fd, dirfd, path);
    return fd;
}

/* ---- metadata: the stat family, access, readlink, directory listings (sources only) ------------------------- */
static int (*real_stat)(const char *, struct stat *);
static int (*real_stat64)(const char *, struct stat64 *);
static int (*real_lstat)(const char *, struct stat *);
static int (*real_lstat64)(const char *, struct stat64 *);
static int (*real_fstatat)(int, const char *, struct stat *, int);
static int (*real_fstatat64)(int, const char *, struct stat64 *, int);
static int (*real_statx)(int, const char *, int, unsigned int, struct statx *);
static int (*real_fstat)(int, struct stat *);
static int (*real_fstat64)(int, struct stat64 *);
static int (*real_access)(const char *, int);
static int (*real_faccessat)(int, const char *, int, int);
static ssize_t (*real_readlink)(const char *, char *, size_t);
static ssize_t (*real_readlinkat)(int, const char *, char *, size_t);
static DIR *(*real_opendir)(const char *);
static DIR *(*real_fdopendir)(int);

#define STAT_CALL(dirfd, path, call)             \
    do {                                         \
        int r_ = call;                           \
        int saved_ = errno;                      \
        source_stat(dirfd, path, r_);            \
        errno = saved_;                          \
        return r_;                               \
    } while (0)

int stat(const char *path, struct stat *st) { RESOLVE(stat); STAT_CALL(AT_FDCWD, path, real_stat(path, st)); }
int stat64(const char *path, struct stat64 *st) { RESOLVE(stat64); STAT_CALL(AT_FDCWD, path, real_stat64(path, st)); }
int lstat(const char *path, struct stat *st) { RESOLVE(lstat); STAT_CALL(AT_FDCWD, path, real_lstat(path, st)); }
int lstat64(const char *path, struct stat64 *st) {
    RESOLVE(lstat64);
    STAT_CALL(AT_FDCWD, path, real_lstat64(path, st));
}
/* fstatat(fd, "", AT_EMPTY_PATH) is an fstat of fd: counted under fd's source like any path relative to it */
int fstatat(int dirfd, const char *path, struct stat *st, int flags) {
    RESOLVE(fstatat);
    STAT_CALL(dirfd, path, real_fstatat(dirfd, path, st, flags));
}
int fstatat64(int dirfd, const char *path, struct stat64 *st, int flags) {
    RESOLVE(fstatat64);
    STAT_CALL(dirfd, path, real_fstatat64(dirfd, path, st, flags));
}
int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *st) {
    RESOLVE(statx);
    STAT_CALL(dirfd, path, real_statx(dirfd, path, flags, mask, st));
}
/* fstat of a descriptor: a metadata call of the descriptor's source (on a parallel file system it may ask the
 * metadata service for the size); descriptors of unknown source are not counted */
static int fstat_done(int fd, int r) {
    if (fd >= 0 && fd < RH_MAX_FD && rh_fd_source[fd]) {
        int saved = errno;
        src_add(rh_fd_source[fd] - 1, RH_S_STATS, 1);
        if (r < 0) src_add(rh_fd_source[fd] - 1, RH_S_STAT_FAILURES, 1);
        errno = saved;
    }
    return r;
}
int fstat(int fd, struct stat *st) { RESOLVE(fstat); return fstat_done(fd, real_fstat(fd, st)); }
int fstat64(int fd, struct stat64 *st) { RESOLVE(fstat64); return fstat_done(fd, real_fstat64(fd, st)); }
int access(const char *path, int mode) { RESOLVE(access); STAT_CALL(AT_FDCWD, path, real_access(path, mode)); }
int faccessat(int dirfd, const char *path, int mode, int flags) {
    RESOLVE(faccessat);
    STAT_CALL(dirfd, path, real_faccessat(dirfd, path, mode, flags));
}
ssize_t readlink(const char *path, char *buf, size_t n) {
    RESOLVE(readlink);
    ssize_t r = real_readlink(path, buf, n);
    int saved = errno;
    source_stat(AT_FDCWD, path, r < 0 ? -1 : 0);
    errno = saved;
    return r;
}
ssize_t readlinkat(int dirfd, const char *path, char *buf, size_t n) {
    RESOLVE(readlinkat);
    ssize_t r = real_readlinkat(dirfd, path, buf, n);
    int saved = errno;
    source_stat(dirfd, path, r < 0 ? -1 : 0);
    errno = saved;
    return r;
}

/* Binaries built against glibc < 2.33 (manylinux wheels) call the stat family through these. */
static void *libc_versioned(const char *name) {
    if (!rh_libc) rh_libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
    static const char *versions[] = {"GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0"};
    for (size_t i = 0; rh_libc && i < sizeof versions / sizeof *versions; i++) {
        void *f = dlvsym(rh_libc, name, versions[i]);
        if (f) return f;
    }
    return libc_symbol(name);
}
static int (*real___xstat)(int, const char *, struct stat *);
static int (*real___xstat64)(int, const char *, struct stat64 *);
static int (*real___lxstat)(int, const char *, struct stat *);
static int (*real___lxstat64)(int, const char *, struct stat64 *);
static int (*real___fxstatat)(int, int, const char *, struct stat *, int);
static int (*real___fxstatat64)(int, int, const char *, struct stat64 *, int);
#define RESOLVE_OLD(name) \
    do { if (!real_##name) real_##name = libc_versioned(#name); } while (0)
int __xstat(int v, const char *path, struct stat *st) {
    RESOLVE_OLD(__xstat);
    STAT_CALL(AT_FDCWD, path, real___xstat(v, path, st));
}
int __xstat64(int v, const char *path, struct stat64 *st) {
    RESOLVE_OLD(__xstat64);
    STAT_CALL(AT_FDCWD, path, real___xstat64(v, path, st));
}
int __lxstat(int v, const char *path, struct stat *st) {
    RESOLVE_OLD(__lxstat);
    STAT_CALL(AT_FDCWD, path, real___lxstat(v, path, st));
}
int __lxstat64(int v, const char *path, struct stat64 *st) {
    RESOLVE_OLD(__lxstat64);
    STAT_CALL(AT_FDCWD, path, real___lxstat64(v, path, st));
}
int __fxstatat(int v, int dirfd, const char *path, struct stat *st, int flags) {
    RESOLVE_OLD(__fxstatat);
    STAT_CALL(dirfd, path, real___fxstatat(v, dirfd, path, st, flags));
}
int __fxstatat64(int v, int dirfd, const char *path, struct stat64 *st, int flags) {
    RESOLVE_OLD(__fxstatat64);
    STAT_CALL(dirfd, path, real___fxstatat64(v, dirfd, path, st, flags));
}

/* A listing: opendir (its open is the listing's, not an open of a file), fdopendir of a descriptor opened earlier. */
DIR *opendir(const char *path) {
    RESOLVE(opendir);
    DIR *d = real_opendir(path);
    int saved = errno;
    int src = source_of(AT_FDCWD, path);
    if (src >= 0) {
        src_add(src, RH_S_LISTINGS, 1);
        if (d) {
            int fd = dirfd(d);
            if (fd >= 0 && fd < RH_MAX_FD) rh_fd_source[fd] = (unsigned char)(src + 1);
        }
    }
    errno = saved;
    return d;
}
DIR *fdopendir(int fd) {
    RESOLVE(fdopendir);
    DIR *d = real_fdopendir(fd);
    if (fd >= 0 && fd < RH_MAX_FD && rh_fd_source[fd]) src_add(rh_fd_source[fd] - 1, RH_S_LISTINGS, 1);
    return d;
}
static int (*real_closedir)(DIR *);
int closedir(DIR *d) {
    RESOLVE(closedir);
    untrack(dirfd(d));
    return real_closedir(d);
}

int close(int fd) {
    RESOLVE(close);
    untrack(fd);
    return real_close(fd);
}

static int open_flags(const char *mode) {
    int flags = 0, plus = strchr(mode, '+') != NULL;
    switch (mode[0]) {
    case 'r': flags = plus ? O_RDWR : O_RDONLY; break;
    case 'w': flags = (plus ? O_RDWR : O_WRONLY) | O_CREAT | O_TRUNC; break;
    case 'a': flags = (plus ? O_RDWR : O_WRONLY) | O_CREAT | O_APPEND; break;
    default: return -1;
    }
    if (strchr(mode, 'x')) flags |= O_EXCL;
    if (strchr(mode, 'e')) flags |= O_CLOEXEC;
    return flags;
}

static FILE *fopen_common(FILE *(*real)(const char *, const char *), const char *path, const char *mode) {
    char absolute[PATH_MAX];
    if (rh_fopen_via_open && tracked_path(path, absolute)) {
        int flags = open_flags(mode);
        if (flags >= 0) {
            /* through the dynamic linker, so that a tracer wrapping open() sees it (this library's open tracks it) */
            int fd = open(path, flags, 0666);
            if (fd < 0) return NULL;
            FILE *f = fdopen(fd, mode);
            if (!f) {
                int saved = errno;
                close(fd);
                errno = saved;
                return NULL;
            }
            return f;
        }
    }
    FILE *f = real(path, mode);
    int saved = errno;
    source_open(AT_FDCWD, path, f ? fileno(f) : -1);
    if (f) track(fileno(f), path);
    errno = saved;
    return f;
}

FILE *fopen(const char *path, const char *mode) {
    RESOLVE(fopen);
    return fopen_common(real_fopen, path, mode);
}

FILE *fopen64(const char *path, const char *mode) {
    RESOLVE(fopen64);
    return fopen_common(real_fopen64, path, mode);
}

int fclose(FILE *f) {
    RESOLVE(fclose);
    if (f) untrack(fileno(f));
    return real_fclose(f);
}

/* ---- data and sync ------------------------------------------------------------------------------------------ */
#define IO_CALL(cls, fd, call)                            \
    do {                                                  \
        int idx_ = file_of(fd);                           \
        if (idx_ < 0) {                                   \
            ssize_t r_ = call;                            \
            int saved_ = errno;                           \
            source_io(fd, cls, r_);                       \
            errno = saved_;                               \
            return r_;                                    \
        }                                                 \
        uint64_t t0_ = begin(cls);                        \
        ssize_t r_ = call;                                \
        int saved_ = errno;                               \
        end(cls, idx_, t0_, r_);                          \
        source_io(fd, cls, r_);                           \
        errno = saved_;                                   \
        return r_;                                        \
    } while (0)

ssize_t read(int fd, void *buf, size_t n) { RESOLVE(read); IO_CALL(RH_READ, fd, real_read(fd, buf, n)); }
ssize_t pread(int fd, void *buf, size_t n, off_t o) { RESOLVE(pread); IO_CALL(RH_READ, fd, real_pread(fd, buf, n, o)); }
ssize_t pread64(int fd, void *buf, size_t n, off_t o) {
    RESOLVE(pread64);
    IO_CALL(RH_READ, fd, real_pread64(fd, buf, n, o));
}
ssize_t readv(int fd, const struct iovec *v, int c) { RESOLVE(readv); IO_CALL(RH_READ, fd, real_readv(fd, v, c)); }
ssize_t preadv(int fd, const struct iovec *v, int c, off_t o) {
    RESOLVE(preadv);
    IO_CALL(RH_READ, fd, real_preadv(fd, v, c, o));
}
ssize_t preadv64(int fd, const struct iovec *v, int c, off_t o) {
    RESOLVE(preadv64);
    IO_CALL(RH_READ, fd, real_preadv64(fd, v, c, o));
}
ssize_t preadv2(int fd, const struct iovec *v, int c, off_t o, int f) {
    RESOLVE(preadv2);
    IO_CALL(RH_READ, fd, real_preadv2(fd, v, c, o, f));
}
ssize_t preadv64v2(int fd, const struct iovec *v, int c, off_t o, int f) {
    RESOLVE(preadv64v2);
    IO_CALL(RH_READ, fd, real_preadv64v2(fd, v, c, o, f));
}
ssize_t write(int fd, const void *buf, size_t n) { RESOLVE(write); IO_CALL(RH_WRITE, fd, real_write(fd, buf, n)); }
ssize_t pwrite(int fd, const void *buf, size_t n, off_t o) {
    RESOLVE(pwrite);
    IO_CALL(RH_WRITE, fd, real_pwrite(fd, buf, n, o));
}
ssize_t pwrite64(int fd, const void *buf, size_t n, off_t o) {
    RESOLVE(pwrite64);
    IO_CALL(RH_WRITE, fd, real_pwrite64(fd, buf, n, o));
}
ssize_t writev(int fd, const struct iovec *v, int c) { RESOLVE(writev); IO_CALL(RH_WRITE, fd, real_writev(fd, v, c)); }
ssize_t pwritev(int fd, const struct iovec *v, int c, off_t o) {
    RESOLVE(pwritev);
    IO_CALL(RH_WRITE, fd, real_pwritev(fd, v, c, o));
}
ssize_t pwritev64(int fd, const struct iovec *v, int c, off_t o) {
    RESOLVE(pwritev64);
    IO_CALL(RH_WRITE, fd, real_pwritev64(fd, v, c, o));
}
ssize_t pwritev2(int fd, const struct iovec *v, int c, off_t o, int f) {
    RESOLVE(pwritev2);
    IO_CALL(RH_WRITE, fd, real_pwritev2(fd, v, c, o, f));
}
ssize_t pwritev64v2(int fd, const struct iovec *v, int c, off_t o, int f) {
    RESOLVE(pwritev64v2);
    IO_CALL(RH_WRITE, fd, real_pwritev64v2(fd, v, c, o, f));
}

size_t fread(void *buf, size_t size, size_t n, FILE *f) {
    RESOLVE(fread);
    int fd = f ? fileno(f) : -1, idx = file_of(fd);
    if (idx < 0) {
        size_t r = real_fread(buf, size, n, f);
        source_io(fd, RH_READ, (ssize_t)(r * size));
        return r;
    }
    uint64_t t0 = begin(RH_READ);
    size_t r = real_fread(buf, size, n, f);
    end(RH_READ, idx, t0, (ssize_t)(r * size));
    source_io(fd, RH_READ, (ssize_t)(r * size));
    return r;
}

size_t fwrite(const void *buf, size_t size, size_t n, FILE *f) {
    RESOLVE(fwrite);
    int fd = fileno(f), idx = file_of(fd);
    if (idx < 0) {
        size_t r = real_fwrite(buf, size, n, f);
        source_io(fd, RH_WRITE, (ssize_t)(r * size));
        return r;
    }
    uint64_t t0 = begin(RH_WRITE);
    size_t r = real_fwrite(buf, size, n, f);
    end(RH_WRITE, idx, t0, (ssize_t)(r * size));
    source_io(fd, RH_WRITE, (ssize_t)(r * size));
    return r;
}

int fsync(int fd) { RESOLVE(fsync); IO_CALL(RH_SYNC, fd, real_fsync(fd)); }
int fdatasync(int fd) { RESOLVE(fdatasync); IO_CALL(RH_SYNC, fd, real_fdatasync(fd)); }

/* ---- libaio ---------------------------------------------------------------------------------------------------
 * libaio's struct iocb and struct io_event have the kernel's layout (linux/aio_abi.h), so no libaio header is
 * needed to build this library. A request on a tracked file is remembered from io_submit to the io_getevents that
 * returns it (keyed by its iocb's address). */
#define RH_MAX_AIO 4096
typedef struct { const struct iocb *iocb; uint64_t t0; int cls, idx; } rh_aio_t;
static rh_aio_t rh_aio[RH_MAX_AIO];
static int (*real_io_submit)(void *, long, struct iocb **);
static int (*real_io_getevents)(void *, long, long, struct io_event *, struct timespec *);
static int (*real_io_pgetevents)(void *, long, long, struct io_event *, struct timespec *, void *);

static int aio_class(int opcode) {
    switch (opcode) {
    case IOCB_CMD_PREAD: case IOCB_CMD_PREADV: return RH_READ;
    case IOCB_CMD_PWRITE: case IOCB_CMD_PWRITEV: return RH_WRITE;
    case IOCB_CMD_FSYNC: case IOCB_CMD_FDSYNC: return RH_SYNC;
    default: return -1;
    }
}

/* libaio is a dependency of the extension that uses it, loaded without RTLD_GLOBAL, so RTLD_NEXT does not reach it:
 * its own handle does (the process has it loaded, or it would not be calling these). */
static void *libaio_symbol(const char *name) {
    void *lib = dlopen("libaio.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!lib) lib = dlopen("libaio.so", RTLD_LAZY | RTLD_NOLOAD);
    void *f = lib ? dlsym(lib, name) : NULL;
    return f ? f : dlsym(RTLD_NEXT, name);
}
#define RESOLVE_AIO(name) \
    do { if (!real_##name) real_##name = libaio_symbol(#name); } while (0)

static size_t aio_slot(const struct iocb *cb) { return ((uintptr_t)cb >> 6) % RH_MAX_AIO; }

int io_submit(void *ctx, long nr, struct iocb **ios) {
    RESOLVE_AIO(io_submit);
    if (!real_io_submit) return -ENOSYS;
    uint64_t t0 = now_ns();
    int n = real_io_submit(ctx, nr, ios);
    for (int i = 0; i < n; i++) {
        int idx = file_of((int)ios[i]->aio_fildes), cls = aio_class(ios[i]->aio_lio_opcode);
        if (idx < 0 || cls < 0) continue;
        pthread_mutex_lock(&rh_lock);
        size_t s = aio_slot(ios[i]);
        for (int k = 0; k < RH_MAX_AIO && rh_aio[s].iocb; k++) s = (s + 1) % RH_MAX_AIO;
        if (!rh_aio[s].iocb) {
            rh_aio[s] = (rh_aio_t){ios[i], t0, cls, idx};
            if (rh_inflight[cls]++ == 0) rh_busy_since[cls] = t0;
        }
        pthread_mutex_unlock(&rh_lock);
    }
    return n;
}

/* The requests io_getevents / io_pgetevents returned are done: each one a call from its submission to now. */
static void reaped(const struct io_event *events, int n) {
    for (int i = 0; i < n; i++) {
        const struct iocb *cb = (const struct iocb *)(uintptr_t)events[i].obj;
        rh_aio_t found = {0};
        pthread_mutex_lock(&rh_lock);
        size_t s = aio_slot(cb);
        for (int k = 0; k < RH_MAX_AIO && rh_aio[s].iocb; k++, s = (s + 1) % RH_MAX_AIO)
            if (rh_aio[s].iocb == cb) {
                found = rh_aio[s];
                /* backward-shift deletion keeps every later entry of the probe run findable */
                size_t hole = s;
                for (size_t j = (s + 1) % RH_MAX_AIO; rh_aio[j].iocb; j = (j + 1) % RH_MAX_AIO) {
                    size_t home = aio_slot(rh_aio[j].iocb);
                    if ((j > hole && (home <= hole || home > j)) || (j < hole && home <= hole && home > j)) {
                        rh_aio[hole] = rh_aio[j];
                        hole = j;
                    }
                }
                rh_aio[hole] = (rh_aio_t){0};
                break;
            }
        pthread_mutex_unlock(&rh_lock);
        if (found.iocb) end(found.cls, found.idx, found.t0, found.cls == RH_SYNC ? 0 : (ssize_t)events[i].res);
    }
}

int io_getevents(void *ctx, long min_nr, long nr, struct io_event *events, struct timespec *timeout) {
    RESOLVE_AIO(io_getevents);
    if (!real_io_getevents) return -ENOSYS;
    int n = real_io_getevents(ctx, min_nr, nr, events, timeout);
    reaped(events, n);
    return n;
}

/* what libaio >= 0.3.112's header makes of io_getevents in its callers (DeepSpeed's async_io op) */
int io_pgetevents(void *ctx, long min_nr, long nr, struct io_event *events, struct timespec *timeout, void *sigmask) {
    RESOLVE_AIO(io_pgetevents);
    if (!real_io_pgetevents) return -ENOSYS;
    int n = real_io_pgetevents(ctx, min_nr, nr, events, timeout, sigmask);
    reaped(events, n);
    return n;
}

/* ---- what Python reads ---------------------------------------------------------------------------------------- */
int rh_io_version(void) { return 2; }

/* Sources: their number, each one's name, and its counters (RH_S_FIELDS values, in the enum's order). */
int rh_io_nsources(void) { return rh_nsrc; }
const char *rh_io_source_name(int i) { return i >= 0 && i < rh_nsrc ? rh_src_name[i] : NULL; }
int rh_io_source(int i, uint64_t *out) {
    if (i < 0 || i >= rh_nsrc) return -1;
    for (int k = 0; k < RH_S_FIELDS; k++) out[k] = __atomic_load_n(&rh_src[i][k], __ATOMIC_RELAXED);
    return RH_S_FIELDS;
}

void rh_io_totals(rh_totals_t *out) {
    pthread_mutex_lock(&rh_lock);
    *out = rh_total;
    uint64_t t = now_ns();
    for (int c = 0; c < RH_CLASSES; c++) /* calls in flight count up to now */
        if (rh_inflight[c] > 0) out->busy_ns[c] += t - rh_busy_since[c];
    pthread_mutex_unlock(&rh_lock);
}

int rh_io_nfiles(void) { return rh_nfiles; }

int rh_io_file(int i, rh_file_t *out) {
    if (i < 0 || i >= rh_nfiles) return -1;
    pthread_mutex_lock(&rh_lock);
    *out = rh_files[i];
    pthread_mutex_unlock(&rh_lock);
    return 0;
}
