/*
 * vlink_preload.c: the LD_PRELOAD shim of "vlink exec".
 *
 * Loaded into an unmodified program, it asks the vlink agent (a Go process
 * reached over an abstract unix socket named by VLINK_AGENT) what each TCP
 * connect should do, and does it:
 *
 *   - direct: connect by itself, as without the shim (the verdict is
 *     cached, and when no rule routes IP addresses the agent is not asked);
 *   - a descriptor: a blocking connect the agent dialed through a stack
 *     whose result is plain TCP comes back over SCM_RIGHTS and replaces the
 *     program's descriptor, keeping its number, flags and options; for a
 *     `tcp` route through a gateway with no key, a recipe comes with it,
 *     and the next blocking connects there are made here, without asking
 *     (the gateway's hello sent and its accept checked: recipe_connect);
 *   - direct with a recipe: for a `tcp` route with options and no gateway
 *     (with the descriptor of a first blocking connect, or for a first
 *     non-blocking one from a socket that can take them: own_socket),
 *     the next connects there, blocking or not, are the program's own,
 *     with the route's options set first;
 *   - a relay: otherwise the program's own socket connects to the agent's
 *     loopback relay listener; a non-blocking connect returns EINPROGRESS at
 *     once, and its socket waits in SYN-SENT on the agent's held listener
 *     while the agent dials: it becomes writable when the far side
 *     answered, or fails with the far side's errno in SO_ERROR
 *     (preload/held_linux.go);
 *   - an error: the errno the kernel would give (EPERM for a destination
 *     the rules refuse).
 *
 * Names that only the far side resolves get fake addresses from the agent
 * (getaddrinfo, gethostbyname*, getnameinfo), getpeername answers the
 * address the program asked for, and getsockname a local address on the
 * path to it. The agent being unreachable fails closed:
 * ENETUNREACH, never a silent direct connect, unless the rules already said
 * direct.
 *
 * With vlink exec --serve, a socket bound to a served port listens on a
 * loopback port instead, the agent listens in its place, and accept hands
 * the program each client the agent passes on: a plain one's own socket,
 * or a VLink one relayed, with its addresses (preload/served_linux.go).
 *
 * Rules this file keeps: no Go runtime; the real symbols are resolved once;
 * the descriptor table and the agent channels are guarded by one mutex,
 * taken with every signal blocked so a handler calling connect cannot
 * deadlock; no malloc on any path a signal handler could reach (strdup only
 * in getaddrinfo, which is not async-signal-safe anyway); errno is kept on
 * success; the shim's descriptors are close-on-exec, sit high, and are out
 * of reach of the program's close, close_range, closefrom and dup2; after
 * fork the child opens its own channels; signal dispositions are never
 * touched.
 *
 * Wire format: preload/frame.go. Every length read here is checked against
 * the fixed size of its message or the bounds there.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#ifndef SYS_close_range
#define SYS_close_range 436
#endif
#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif
#ifndef IPPROTO_MPTCP
#define IPPROTO_MPTCP 262
#endif
#ifndef SO_BINDTOIFINDEX
#define SO_BINDTOIFINDEX 62
#endif
#ifndef MSG_FASTOPEN
#define MSG_FASTOPEN 0x20000000
#endif
#ifndef UIO_MAXIOV
#define UIO_MAXIOV 1024 /* the most messages recvmmsg and sendmmsg take */
#endif

#define EXPORT __attribute__((visibility("default")))
#define TLS __thread __attribute__((tls_model("initial-exec")))

/* ---- protocol (preload/frame.go) ---- */

#define VL_VERSION 2
#define VL_HDR 4
#define VL_MAXBODY 512
#define VL_MAXNAME 253
#define VL_ADDR 19
#define VL_WELCOME 38
#define VL_TOKEN 16
#define VL_HELLO (4 + VL_TOKEN)
#define VL_CONNECT (VL_ADDR + 6)
#define VL_RESULT 12
#define VL_ATTACH (8 + VL_ADDR)
#define VL_NAME 21
#define VL_PEERADDR (1 + VL_ADDR)
#define VL_WHY 8
#define VL_ERRNO 2
#define VL_LISTEN (2 * VL_ADDR)
#define VL_ACCEPTINFO (1 + 2 * VL_ADDR)
#define VL_DATAGRAM (2 * VL_ADDR + 1)
#define MAX_SERVED 64

enum {
	M_HELLO = 1, M_WELCOME, M_CONNECT, M_RESULT, M_ATTACH, M_RESOLVE,
	M_NAME, M_PEER, M_PEERADDR, M_ADDRNAME, M_NAMEOF, M_IPTABLE, M_WHY, M_ERRNO,
	M_SERVED, M_LISTEN, M_ACCEPTED, M_ACCEPTINFO, M_DATAGRAM, M_RECIPE, M_ANSWER
};
enum { MODE_ASYNC = 1, MODE_SYNC = 2, MODE_OWN = 0x80 };
enum { R_DIRECT = 1, R_ERROR = 2, R_RELAY = 3, R_FD = 4, R_DGRAM = 5 };
enum { N_LOCAL = 1, N_FAKE = 2, N_NONE = 3 };
#define K_NODATA 100 /* not on the wire: N_FAKE without the family asked for */
#define RESULT_CACHE 1
#define RESULT_RECIPE 2
/* preload/recipe.go's limits */
#define RCP_OPTS 8
#define RCP_OPTVAL 16
#define RCP_HELLO 256
#define RCP_ACCEPT 32
#define RCP_ANSWER 256
enum { OPT_INT = 1, OPT_BYTES = 2 };
#define WELCOME_IPS_DIRECT 1
#define WELCOME_IP_TABLE 2
#define WELCOME_SERVED 4
enum { A_UNKNOWN = 0, A_PLAIN = 1, A_RELAYED = 2 };
#define MAX_IPRULES 32 /* preload/iptable.go */
#define MAX_IPPORTS 16
enum { IP_DIRECT = 1, IP_REFUSE = 2, IP_ASK = 3 };

/* ---- real symbols ---- */

static struct {
	int (*connect)(int, const struct sockaddr *, socklen_t);
	int (*close)(int);
	int (*close_range)(unsigned int, unsigned int, int);
	int (*dup)(int);
	int (*dup2)(int, int);
	int (*dup3)(int, int, int);
	int (*fcntl)(int, int, ...);
	int (*fcntl64)(int, int, ...);
	int (*getpeername)(int, struct sockaddr *, socklen_t *);
	int (*getsockname)(int, struct sockaddr *, socklen_t *);
	int (*getsockopt)(int, int, int, void *, socklen_t *);
	int (*setsockopt)(int, int, int, const void *, socklen_t);
	int (*bind)(int, const struct sockaddr *, socklen_t);
	int (*listen)(int, int);
	int (*accept4)(int, struct sockaddr *, socklen_t *, int);
	int (*getaddrinfo)(const char *, const char *, const struct addrinfo *, struct addrinfo **);
	struct hostent *(*gethostbyname)(const char *);
	struct hostent *(*gethostbyname2)(const char *, int);
	int (*gethostbyname_r)(const char *, struct hostent *, char *, size_t, struct hostent **, int *);
	int (*gethostbyname2_r)(const char *, int, struct hostent *, char *, size_t, struct hostent **, int *);
	int (*getnameinfo)(const struct sockaddr *, socklen_t, char *, socklen_t, char *, socklen_t, int);
	ssize_t (*send)(int, const void *, size_t, int);
	ssize_t (*sendto)(int, const void *, size_t, int, const struct sockaddr *, socklen_t);
	ssize_t (*sendmsg)(int, const struct msghdr *, int);
	int (*sendmmsg)(int, struct mmsghdr *, unsigned int, int);
	ssize_t (*recvfrom)(int, void *, size_t, int, struct sockaddr *, socklen_t *);
	ssize_t (*recvfrom_chk)(int, void *, size_t, size_t, int, struct sockaddr *, socklen_t *);
	ssize_t (*recvmsg)(int, struct msghdr *, int);
	int (*recvmmsg)(int, struct mmsghdr *, unsigned int, int, struct timespec *);
} real;

/* The system calls below fall back on syscall(2) should a symbol be missing. */
static int sys_connect(int fd, const struct sockaddr *sa, socklen_t len)
{
	return real.connect ? real.connect(fd, sa, len) : (int)syscall(SYS_connect, fd, sa, len);
}
static int sys_close(int fd)
{
	return real.close ? real.close(fd) : (int)syscall(SYS_close, fd);
}
static int sys_close_range(unsigned int first, unsigned int last, int flags)
{
	return real.close_range ? real.close_range(first, last, flags)
				: (int)syscall(SYS_close_range, first, last, flags);
}
static int sys_fcntl(int fd, int cmd, long arg)
{
	return real.fcntl ? real.fcntl(fd, cmd, arg) : (int)syscall(SYS_fcntl, fd, cmd, arg);
}
static int sys_dup3(int old, int new, int flags)
{
	return real.dup3 ? real.dup3(old, new, flags) : (int)syscall(SYS_dup3, old, new, flags);
}
static int sys_setsockopt(int fd, int level, int name, const void *val, socklen_t len)
{
	return real.setsockopt ? real.setsockopt(fd, level, name, val, len)
			       : (int)syscall(SYS_setsockopt, fd, level, name, val, len);
}
static int sys_bind(int fd, const struct sockaddr *sa, socklen_t len)
{
	return real.bind ? real.bind(fd, sa, len) : (int)syscall(SYS_bind, fd, sa, len);
}
static int sys_listen(int fd, int backlog)
{
	return real.listen ? real.listen(fd, backlog) : (int)syscall(SYS_listen, fd, backlog);
}
static int sys_accept4(int fd, struct sockaddr *sa, socklen_t *len, int flags)
{
	return real.accept4 ? real.accept4(fd, sa, len, flags) : (int)syscall(SYS_accept4, fd, sa, len, flags);
}
static int sys_getsockopt(int fd, int level, int name, void *val, socklen_t *len)
{
	return real.getsockopt ? real.getsockopt(fd, level, name, val, len)
			       : (int)syscall(SYS_getsockopt, fd, level, name, val, len);
}
static int sys_getpeername(int fd, struct sockaddr *sa, socklen_t *len)
{
	return real.getpeername ? real.getpeername(fd, sa, len) : (int)syscall(SYS_getpeername, fd, sa, len);
}
static int sys_getsockname(int fd, struct sockaddr *sa, socklen_t *len)
{
	return real.getsockname ? real.getsockname(fd, sa, len) : (int)syscall(SYS_getsockname, fd, sa, len);
}

/* ---- global state ---- */

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static sigset_t g_fork_mask; /* the mask saved across fork by the atfork handlers */

static struct sockaddr_un g_agent; /* from VLINK_AGENT */
static socklen_t g_agent_len;      /* 0: not set */
/* From VLINK_AGENT_TOKEN, read once: it proves to the agent that this
 * process belongs to the program, whatever user it has become since (a
 * daemon's workers drop privileges after the environment is gone). */
static unsigned char g_token[VL_TOKEN];
static int g_debug, g_nocache, g_fdbase = 3;
static pid_t g_pid;

/* What the agent said in its welcome; fake ranges default to frame.go's. */
static struct {
	int known;
	uint32_t flags;
	uint16_t relay4, relay6, held4, held6;
	uint32_t timeout_ms;
	unsigned char fake4[4], fake6[16];
	int bits4, bits6;
} g_w = { 0, 0, 0, 0, 0, 0, 0, { 198, 18, 0, 0 },
	  { 0xfd, 0x76, 0x6c, 0x69, 0x6e, 0x6b, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 }, 15, 96 };

/* The rules for IP destinations (preload/iptable.go), so that a direct
 * or refused real address is decided here, without a round trip. */
struct iprule {
	unsigned char action, fam, bits, nports;
	unsigned char ip[16];
	uint16_t lo[MAX_IPPORTS], hi[MAX_IPPORTS];
};

static struct {
	int known, n, def;
	struct iprule r[MAX_IPRULES];
} g_ipt;

/* The ports on which the agent takes VLink clients for the program
 * (preload/served_linux.go); fixed once known. */
static struct {
	int known, n;
	uint16_t port[MAX_SERVED];
} g_served;

/* Set while the shim itself talks to the agent or calls the real
 * resolver, so that nothing it calls is redirected again should another
 * interposer route it back here. Saved and restored, never just cleared,
 * so that a signal handler's call nests. connect does not look at it: a
 * connect is async-signal-safe, and one from a handler that interrupted
 * the shim must still follow the rules (the shim itself never connects an
 * internet socket through the hook, so there is nothing to recurse). */
static TLS int t_busy;

typedef struct {
	sigset_t old;
} lockstate;

static void lock(lockstate *ls)
{
	sigset_t all;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &ls->old);
	pthread_mutex_lock(&g_lock);
}

static void unlock(lockstate *ls)
{
	pthread_mutex_unlock(&g_lock);
	pthread_sigmask(SIG_SETMASK, &ls->old, NULL);
}

/* note writes one line to stderr, only if stderr is a terminal, a pipe or
 * a file: a program whose descriptor 2 is a socket must not get our text
 * in its protocol. */
static void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int no_datagrams(void);
static void note(const char *fmt, ...)
{
	int saved = errno;
	struct stat st;
	if (fstat(2, &st) == 0 && (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode) || S_ISREG(st.st_mode))) {
		char buf[512];
		int n = snprintf(buf, sizeof buf, "vlink preload[%d]: ", (int)getpid());
		va_list ap;
		va_start(ap, fmt);
		if (n > 0 && n < (int)sizeof buf)
			n += vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
		va_end(ap);
		if (n >= (int)sizeof buf - 1)
			n = (int)sizeof buf - 2;
		if (n > 0) {
			buf[n++] = '\n';
			ssize_t w = write(2, buf, (size_t)n);
			(void)w;
		}
	}
	errno = saved;
}

#define debugf(...)                 \
	do {                        \
		if (g_debug)        \
			note(__VA_ARGS__); \
	} while (0)

/* ---- descriptor table ---- */

#define OPT_MAX 16 /* bytes of a recorded option's value */
#define MAX_OPTS 8 /* options recorded per socket */
#define PAGE_FDS 64
#define MAX_FDS (1 << 20)

enum {
	ST_NONE = 0,
	ST_OPTS = 1,
	ST_REDIRECTED = 2,
	ST_SERVED = 3, /* bound to a served port in the program's place */
	ST_UDPMAP = 4, /* a UDP socket with relays in g_umap */
};
/* A held connect's state (see held_error). */
enum { HELD_NO = 0, HELD_PENDING = 1 };

struct vopt {
	int level, name;
	unsigned char len;
	unsigned char val[OPT_MAX];
};

union vsockaddr {
	struct sockaddr sa;
	struct sockaddr_in in4;
	struct sockaddr_in6 in6;
};

struct vent {
	unsigned char state;
	unsigned char nopts;
	unsigned char origlen;
	unsigned char held; /* HELD_*: a non-blocking connect the agent held; token says which */
	unsigned char dgram; /* a UDP socket connected to the agent's datagram relay, whose port is token */
	uint64_t token;
	ino_t ino; /* the socket's inode: an entry whose descriptor was closed
		    * behind the shim's back (fclose, a raw syscall) is stale */
	union vsockaddr orig; /* the address the program connected to (ST_SERVED: bound) */
	union vsockaddr self; /* an accepted VLink client's: the address it connected to */
	unsigned char selflen;
	struct vopt opts[MAX_OPTS];
};

static struct vent *g_pages[MAX_FDS / PAGE_FDS];

/* slot returns fd's entry, allocating its page if create; under g_lock. */
static struct vent *slot(int fd, int create)
{
	if (fd < 0 || fd >= MAX_FDS)
		return NULL;
	struct vent *page = g_pages[fd / PAGE_FDS];
	if (!page) {
		if (!create)
			return NULL;
		void *p = mmap(NULL, PAGE_FDS * sizeof(struct vent), PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p == MAP_FAILED)
			return NULL;
		page = p;
		__atomic_store_n(&g_pages[fd / PAGE_FDS], page, __ATOMIC_RELEASE);
	}
	return &page[fd % PAGE_FDS];
}

static int sock_ino(int fd, ino_t *ino)
{
	struct stat st;
	if (fstat(fd, &st) < 0 || !S_ISSOCK(st.st_mode))
		return -1;
	*ino = st.st_ino;
	return 0;
}

/* valid returns fd's entry if it still describes the socket fd refers to;
 * under g_lock. */
static struct vent *valid(int fd)
{
	struct vent *e = slot(fd, 0);
	if (!e || e->state == ST_NONE)
		return NULL;
	ino_t ino;
	if (sock_ino(fd, &ino) < 0 || ino != e->ino) {
		memset(e, 0, sizeof *e);
		return NULL;
	}
	return e;
}

/* entry_copy copies fd's entry if it is in state st; 0 if not. */
static int entry_copy(int fd, int st, struct vent *out);

static int entry_state(int fd);

/* has_entry is the lock-free fast path of close: most descriptors have no
 * entry. */
static int has_entry(int fd)
{
	return entry_state(fd) != ST_NONE;
}

/* entry_state is the state of fd's entry, lock-free and unchecked (the
 * entry may be stale): a fast way to rule entries out. */
static int entry_state(int fd)
{
	if (fd < 0 || fd >= MAX_FDS)
		return ST_NONE;
	struct vent *page = __atomic_load_n(&g_pages[fd / PAGE_FDS], __ATOMIC_ACQUIRE);
	return page ? __atomic_load_n(&page[fd % PAGE_FDS].state, __ATOMIC_RELAXED) : ST_NONE;
}

/* entry_any copies fd's entry, whatever its state; 0 if it has none. */
static int entry_any(int fd, struct vent *out)
{
	lockstate ls;
	lock(&ls);
	struct vent *e = valid(fd);
	if (e)
		*out = *e;
	unlock(&ls);
	return e != NULL;
}

static int entry_copy(int fd, int st, struct vent *out)
{
	if (!has_entry(fd))
		return 0;
	int ok = 0;
	lockstate ls;
	lock(&ls);
	struct vent *e = valid(fd);
	if (e && e->state == st) {
		*out = *e;
		ok = 1;
	}
	unlock(&ls);
	return ok;
}

static void forget(int fd)
{
	if (!has_entry(fd))
		return;
	lockstate ls;
	lock(&ls);
	struct vent *e = slot(fd, 0);
	if (e)
		memset(e, 0, sizeof *e);
	unlock(&ls);
}

static void forget_range(unsigned int first, unsigned int last)
{
	lockstate ls;
	lock(&ls);
	for (unsigned int p = first / PAGE_FDS; p < MAX_FDS / PAGE_FDS && p <= last / PAGE_FDS; p++) {
		struct vent *page = g_pages[p];
		if (!page)
			continue;
		for (unsigned int i = 0; i < PAGE_FDS; i++) {
			unsigned int fd = p * PAGE_FDS + i;
			if (fd >= first && fd <= last)
				memset(&page[i], 0, sizeof page[i]);
		}
	}
	unlock(&ls);
}

/* copy_entry makes new's entry a copy of old's (dup and friends). */
static void copy_entry(int old, int new)
{
	if (!has_entry(old) && !has_entry(new))
		return;
	lockstate ls;
	lock(&ls);
	struct vent *src = valid(old);
	struct vent *dst = slot(new, src != NULL);
	if (dst) {
		if (src)
			*dst = *src;
		else
			memset(dst, 0, sizeof *dst);
	}
	unlock(&ls);
}

/* ---- agent channels ---- */

#define MAX_CH 64

struct vch {
	int fd; /* -1: free */
	ino_t ino;
	int busy;
};

static struct vch g_ch[MAX_CH];

/* ours reports whether fd is one of the shim's descriptors. */
static int ours(int fd)
{
	if (fd < 0)
		return 0;
	for (int i = 0; i < MAX_CH; i++)
		if (__atomic_load_n(&g_ch[i].fd, __ATOMIC_RELAXED) == fd)
			return 1;
	return 0;
}

static int ch_fd(int i)
{
	return __atomic_load_n(&g_ch[i].fd, __ATOMIC_RELAXED);
}

/* after_fork drops the channels a child inherited: their streams are the
 * parent's. Under g_lock, or in the child's atfork handler. */
static void after_fork(void)
{
	for (int i = 0; i < MAX_CH; i++) {
		if (g_ch[i].fd >= 0)
			sys_close(g_ch[i].fd);
		g_ch[i].fd = -1;
		g_ch[i].busy = 0;
	}
	g_pid = getpid();
}

static void atfork_prepare(void)
{
	sigset_t all;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &g_fork_mask);
	pthread_mutex_lock(&g_lock);
}

static void atfork_parent(void)
{
	pthread_mutex_unlock(&g_lock);
	pthread_sigmask(SIG_SETMASK, &g_fork_mask, NULL);
}

static void atfork_child(void)
{
	pthread_mutex_init(&g_lock, NULL);
	after_fork();
	pthread_sigmask(SIG_SETMASK, &g_fork_mask, NULL);
}

static int send_all(int i, const unsigned char *b, size_t n)
{
	while (n > 0) {
		ssize_t w = send(ch_fd(i), b, n, MSG_NOSIGNAL);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		b += w;
		n -= (size_t)w;
	}
	return 0;
}

static int send_frame(int i, int type, const unsigned char *body, size_t n)
{
	unsigned char buf[VL_HDR + VL_MAXBODY];
	if (n > VL_MAXBODY) {
		errno = EMSGSIZE;
		return -1;
	}
	buf[0] = VL_VERSION;
	buf[1] = (unsigned char)type;
	buf[2] = (unsigned char)(n >> 8);
	buf[3] = (unsigned char)n;
	memcpy(buf + VL_HDR, body, n);
	return send_all(i, buf, VL_HDR + n);
}

/* recv_frame reads one frame of type want with a body of min to max bytes
 * into body. A descriptor passed with it goes to *rfd if rfd is given and
 * is closed otherwise. With eintr, an interrupted wait returns EINTR (a
 * blocking connect must, as the kernel's does); otherwise it is retried.
 * Any other failure leaves the channel unusable. */
static int recv_frame(int i, int want, unsigned char *body, size_t min, size_t max, size_t *n, int *rfd,
		      int eintr)
{
	unsigned char hdr[VL_HDR];
	size_t got = 0;
	int fd = -1;
	if (rfd)
		*rfd = -1;
	while (got < VL_HDR) {
		union {
			char buf[CMSG_SPACE(sizeof(int) * 4)];
			struct cmsghdr align;
		} cm;
		struct iovec iov = { hdr + got, VL_HDR - got };
		struct msghdr mh;
		memset(&mh, 0, sizeof mh);
		mh.msg_iov = &iov;
		mh.msg_iovlen = 1;
		mh.msg_control = cm.buf;
		mh.msg_controllen = sizeof cm.buf;
		ssize_t r = recvmsg(ch_fd(i), &mh, MSG_CMSG_CLOEXEC);
		if (r < 0) {
			if (errno == EINTR && !eintr)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				errno = ETIMEDOUT;
			goto fail;
		}
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
			if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
				continue;
			size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			int fds[4];
			memcpy(fds, CMSG_DATA(c), (k > 4 ? 4 : k) * sizeof(int));
			for (size_t j = 0; j < k && j < 4; j++) {
				if (fd < 0 && k == 1)
					fd = fds[j];
				else
					sys_close(fds[j]); /* more than one: not ours to keep */
			}
		}
		if (r == 0) {
			errno = ECONNRESET;
			goto fail;
		}
		got += (size_t)r;
	}
	size_t len = ((size_t)hdr[2] << 8) | hdr[3];
	if (hdr[0] != VL_VERSION || hdr[1] != want || len < min || len > max) {
		note("agent sent a malformed frame (version %d, type %d, %zu bytes; want type %d)", hdr[0], hdr[1],
		     len, want);
		errno = EPROTO;
		goto fail;
	}
	got = 0;
	while (got < len) {
		ssize_t r = recv(ch_fd(i), body + got, len - got, 0);
		if (r < 0 && errno == EINTR && !eintr)
			continue;
		if (r <= 0) {
			if (r == 0)
				errno = ECONNRESET;
			goto fail;
		}
		got += (size_t)r;
	}
	*n = len;
	if (fd >= 0) {
		if (rfd)
			*rfd = fd;
		else
			sys_close(fd);
	}
	return 0;
fail:
	if (fd >= 0)
		sys_close(fd);
	return -1;
}

static uint16_t get16(const unsigned char *b)
{
	return (uint16_t)((b[0] << 8) | b[1]);
}
static uint32_t get32(const unsigned char *b)
{
	return ((uint32_t)b[0] << 24) | ((uint32_t)b[1] << 16) | ((uint32_t)b[2] << 8) | b[3];
}
static uint64_t get64(const unsigned char *b)
{
	return ((uint64_t)get32(b) << 32) | get32(b + 4);
}
static void put16(unsigned char *b, uint16_t v)
{
	b[0] = (unsigned char)(v >> 8);
	b[1] = (unsigned char)v;
}
static void put32(unsigned char *b, uint32_t v)
{
	put16(b, (uint16_t)(v >> 16));
	put16(b + 2, (uint16_t)v);
}
static void put64(unsigned char *b, uint64_t v)
{
	put32(b, (uint32_t)(v >> 32));
	put32(b + 4, (uint32_t)v);
}

/* iptable_load checks and keeps the agent's IP table; a malformed one is
 * ignored (the shim then asks about every address). */
static void iptable_load(const unsigned char *b, size_t n)
{
	static struct iprule r[MAX_IPRULES];
	int count = b[0], def = b[1];
	size_t off = 2;
	if (count > MAX_IPRULES || def < IP_DIRECT || def > IP_ASK)
		goto bad;
	for (int k = 0; k < count; k++) {
		if (off + 20 > n)
			goto bad;
		struct iprule *x = &r[k];
		x->action = b[off];
		x->fam = b[off + 1];
		memcpy(x->ip, b + off + 2, 16);
		x->bits = b[off + 18];
		x->nports = b[off + 19];
		off += 20;
		if (x->action < IP_DIRECT || x->action > IP_ASK || (x->fam != 0 && x->fam != 4 && x->fam != 6) ||
		    x->bits > (x->fam == 4 ? 32 : 128) || x->nports > MAX_IPPORTS || off + 4u * x->nports > n)
			goto bad;
		for (int j = 0; j < x->nports; j++, off += 4) {
			x->lo[j] = get16(b + off);
			x->hi[j] = get16(b + off + 2);
		}
	}
	if (off != n)
		goto bad;
	lockstate ls;
	lock(&ls);
	if (!g_ipt.known) {
		memcpy(g_ipt.r, r, sizeof r);
		g_ipt.n = count;
		g_ipt.def = def;
		__atomic_store_n(&g_ipt.known, 1, __ATOMIC_RELEASE);
	}
	unlock(&ls);
	return;
bad:
	note("agent sent a malformed IP table; asking about every address");
}

/* ch_open connects slot i (reserved by the caller) to the agent and reads
 * its welcome. */
static int ch_open(int i)
{
	int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -1;
	/* High, out of the way of descriptors programs pick for dup2. */
	int hi = sys_fcntl(s, F_DUPFD_CLOEXEC, g_fdbase);
	if (hi >= 0) {
		sys_close(s);
		s = hi;
	}
	struct timeval tv = { 10, 0 };
	sys_setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	sys_setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	if (sys_connect(s, (struct sockaddr *)&g_agent, g_agent_len) < 0) {
		int e = errno;
		sys_close(s);
		errno = e;
		return -1;
	}
	ino_t ino = 0;
	sock_ino(s, &ino);
	g_ch[i].ino = ino;
	__atomic_store_n(&g_ch[i].fd, s, __ATOMIC_RELAXED);

	unsigned char b[VL_MAXBODY];
	size_t n;
	put32(b, (uint32_t)getpid());
	memcpy(b + 4, g_token, VL_TOKEN);
	if (send_frame(i, M_HELLO, b, VL_HELLO) < 0 || recv_frame(i, M_WELCOME, b, VL_WELCOME, VL_WELCOME, &n, NULL, 0) < 0)
		goto fail;
	if (b[16] > 32 || b[33] > 128) {
		note("agent sent a malformed welcome");
		errno = EPROTO;
		goto fail;
	}
	uint32_t timeout_ms = get32(b + 8);
	uint32_t flags = get32(b);
	lockstate ls;
	lock(&ls);
	/* VLINK_PRELOAD_CACHE=0, for measurements: ask about every connect. */
	g_w.flags = g_nocache ? flags & ~(uint32_t)WELCOME_IPS_DIRECT : flags;
	g_w.relay4 = get16(b + 4);
	g_w.relay6 = get16(b + 6);
	g_w.timeout_ms = timeout_ms;
	memcpy(g_w.fake4, b + 12, 4);
	g_w.bits4 = b[16];
	memcpy(g_w.fake6, b + 17, 16);
	g_w.bits6 = b[33];
	g_w.held4 = get16(b + 34);
	g_w.held6 = get16(b + 36);
	g_w.known = 1;
	unlock(&ls);
	if (flags & WELCOME_IP_TABLE) {
		if (recv_frame(i, M_IPTABLE, b, 2, VL_MAXBODY, &n, NULL, 0) < 0)
			goto fail;
		if (!g_nocache)
			iptable_load(b, n);
	}
	if (flags & WELCOME_SERVED) {
		if (recv_frame(i, M_SERVED, b, 1, 1 + 2 * MAX_SERVED, &n, NULL, 0) < 0)
			goto fail;
		if (b[0] > MAX_SERVED || n != 1 + 2 * (size_t)b[0]) {
			note("agent sent a malformed list of served ports");
			errno = EPROTO;
			goto fail;
		}
		lock(&ls);
		if (!g_served.known) {
			g_served.n = b[0];
			for (int k = 0; k < b[0]; k++)
				g_served.port[k] = get16(b + 1 + 2 * k);
			__atomic_store_n(&g_served.known, 1, __ATOMIC_RELEASE);
		}
		unlock(&ls);
	}
	/* A dial may take the agent's whole dial timeout: wait that long and
	 * some more for the reply, and no longer should the agent hang. */
	tv.tv_sec = (time_t)(timeout_ms / 1000 + 15);
	sys_setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	return 0;
fail:;
	int e = errno;
	__atomic_store_n(&g_ch[i].fd, -1, __ATOMIC_RELAXED);
	sys_close(s);
	errno = e;
	return -1;
}

/* get_chan takes a channel for one request and its reply, opening one if
 * none is idle. */
static int get_chan(void)
{
	if (g_agent_len == 0) {
		errno = ENOTCONN;
		return -1;
	}
	/* Waiting for a free channel lasts at most a dial's time and then some. */
	for (int tries = 0; tries < 60000; tries++) {
		lockstate ls;
		lock(&ls);
		if (getpid() != g_pid)
			after_fork(); /* forked without the atfork handlers (a raw clone) */
		int free = -1;
		for (int i = 0; i < MAX_CH; i++) {
			if (g_ch[i].busy)
				continue;
			if (g_ch[i].fd >= 0) {
				ino_t ino;
				if (sock_ino(g_ch[i].fd, &ino) < 0 || ino != g_ch[i].ino) {
					/* Closed behind our back, perhaps reused: not ours now. */
					__atomic_store_n(&g_ch[i].fd, -1, __ATOMIC_RELAXED);
				} else {
					g_ch[i].busy = 1;
					unlock(&ls);
					return i;
				}
			}
			if (free < 0)
				free = i;
		}
		if (free >= 0) {
			g_ch[free].busy = 1;
			unlock(&ls);
			if (ch_open(free) < 0) {
				int e = errno;
				lock(&ls);
				g_ch[free].busy = 0;
				unlock(&ls);
				errno = e;
				return -1;
			}
			return free;
		}
		unlock(&ls);
		/* Every channel is busy: more threads are asking at once than
		 * MAX_CH. Wait for one. */
		struct timespec ts = { 0, 1000000 };
		nanosleep(&ts, NULL);
	}
	errno = EAGAIN;
	return -1;
}

/* put_chan gives a channel back; a channel that failed is closed. */
static void put_chan(int i, int ok)
{
	lockstate ls;
	lock(&ls);
	if (!ok && g_ch[i].fd >= 0) {
		sys_close(g_ch[i].fd);
		__atomic_store_n(&g_ch[i].fd, -1, __ATOMIC_RELAXED);
	}
	g_ch[i].busy = 0;
	unlock(&ls);
}

/* agent_down reports a failure to reach the agent, once per process. */
static void agent_down(int e)
{
	static pid_t noted;
	if (noted == getpid())
		return;
	noted = getpid();
	if (g_agent_len == 0)
		note("VLINK_AGENT is not set: refusing network connections (fail closed); run the program with vlink exec");
	else
		note("cannot reach the vlink agent (%s): refusing connections it must route (fail closed)", strerror(e));
}

/* welcome_known makes sure the agent's welcome has been read. */
static int welcome_known(void)
{
	if (__atomic_load_n(&g_w.known, __ATOMIC_ACQUIRE))
		return 1;
	int i = get_chan();
	if (i < 0)
		return 0;
	put_chan(i, 1);
	return 1;
}

/* ---- addresses ---- */

struct vaddr {
	unsigned char fam; /* 4 or 6 */
	uint16_t port;
	unsigned char ip[16];
};

static const unsigned char v4mapped[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };

/* to_vaddr reads an AF_INET or AF_INET6 address; IPv4-mapped IPv6
 * addresses become IPv4. */
static int to_vaddr(const struct sockaddr *sa, socklen_t len, struct vaddr *v)
{
	memset(v, 0, sizeof *v);
	if (sa->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
		const struct sockaddr_in *s = (const void *)sa;
		v->fam = 4;
		v->port = ntohs(s->sin_port);
		memcpy(v->ip, &s->sin_addr, 4);
		return 0;
	}
	/* 24 bytes: an IPv6 address without its scope id (RFC 2133), which the
	 * kernel accepts too. */
	if (sa->sa_family == AF_INET6 && len >= 24) {
		const struct sockaddr_in6 *s = (const void *)sa;
		v->port = ntohs(s->sin6_port);
		if (memcmp(&s->sin6_addr, v4mapped, 12) == 0) {
			v->fam = 4;
			memcpy(v->ip, (const unsigned char *)&s->sin6_addr + 12, 4);
		} else {
			v->fam = 6;
			memcpy(v->ip, &s->sin6_addr, 16);
		}
		return 0;
	}
	return -1;
}

/* from_vaddr writes v as a sockaddr of family fam (AF_INET6 gets IPv4
 * addresses mapped). */
static socklen_t from_vaddr(const struct vaddr *v, int fam, union vsockaddr *out)
{
	memset(out, 0, sizeof *out);
	if (fam == AF_INET) {
		out->in4.sin_family = AF_INET;
		out->in4.sin_port = htons(v->port);
		memcpy(&out->in4.sin_addr, v->ip, 4);
		return sizeof out->in4;
	}
	out->in6.sin6_family = AF_INET6;
	out->in6.sin6_port = htons(v->port);
	if (v->fam == 4) {
		memcpy(&out->in6.sin6_addr, v4mapped, 12);
		memcpy((unsigned char *)&out->in6.sin6_addr + 12, v->ip, 4);
	} else {
		memcpy(&out->in6.sin6_addr, v->ip, 16);
	}
	return sizeof out->in6;
}

static void put_addr(unsigned char *b, const struct vaddr *v)
{
	b[0] = v->fam;
	put16(b + 1, v->port);
	memset(b + 3, 0, 16);
	memcpy(b + 3, v->ip, v->fam == 4 ? 4 : 16);
}

static int get_addr(const unsigned char *b, struct vaddr *v)
{
	memset(v, 0, sizeof *v);
	if (b[0] != 4 && b[0] != 6)
		return -1;
	v->fam = b[0];
	v->port = get16(b + 1);
	memcpy(v->ip, b + 3, b[0] == 4 ? 4 : 16);
	return 0;
}

static int prefix_match(const unsigned char *ip, const unsigned char *prefix, int bits)
{
	int full = bits / 8, rest = bits % 8;
	if (memcmp(ip, prefix, (size_t)full) != 0)
		return 0;
	if (rest == 0)
		return 1;
	unsigned char mask = (unsigned char)(0xff << (8 - rest));
	return (ip[full] & mask) == (prefix[full] & mask);
}

static int is_fake(const struct vaddr *v)
{
	if (v->fam == 4)
		return prefix_match(v->ip, g_w.fake4, g_w.bits4);
	return prefix_match(v->ip, g_w.fake6, g_w.bits6);
}

static int is_loopback(const struct vaddr *v)
{
	static const unsigned char lo6[16] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1 };
	return v->fam == 4 ? v->ip[0] == 127 : memcmp(v->ip, lo6, 16) == 0;
}

/* iptable_eval returns what the agent's rules say for a real address:
 * IP_DIRECT, IP_REFUSE or IP_ASK, or 0 without a table. The table never
 * changes once known, so it is read without the lock. */
static int iptable_eval(const struct vaddr *v)
{
	if (!__atomic_load_n(&g_ipt.known, __ATOMIC_ACQUIRE))
		return 0;
	for (int k = 0; k < g_ipt.n; k++) {
		const struct iprule *x = &g_ipt.r[k];
		if (x->fam != 0 && (x->fam != v->fam || !prefix_match(v->ip, x->ip, x->bits)))
			continue;
		int in = x->nports == 0;
		for (int j = 0; j < x->nports && !in; j++)
			in = x->lo[j] <= v->port && v->port <= x->hi[j];
		if (in)
			return x->action;
	}
	return g_ipt.def;
}

/* ---- verdict cache: direct and refused destinations ---- */

#define CACHE_SIZE 512

struct vcache {
	unsigned char used, kind;
	uint16_t err;
	struct vaddr a;
};

static struct vcache g_cache[CACHE_SIZE];

static unsigned cache_slot(const struct vaddr *v)
{
	uint32_t h = 2166136261u;
	const unsigned char *p = (const unsigned char *)v;
	for (size_t i = 0; i < sizeof *v; i++)
		h = (h ^ p[i]) * 16777619u;
	return h % CACHE_SIZE;
}

/* cache_get returns R_DIRECT or R_ERROR (with *err), or 0. */
static int cache_get(const struct vaddr *v, int *err)
{
	if (g_nocache)
		return 0;
	lockstate ls;
	lock(&ls);
	struct vcache *c = &g_cache[cache_slot(v)];
	int kind = 0;
	if (c->used && memcmp(&c->a, v, sizeof *v) == 0) {
		kind = c->kind;
		*err = c->err;
	}
	unlock(&ls);
	return kind;
}

static void cache_put(const struct vaddr *v, int kind, int err)
{
	lockstate ls;
	lock(&ls);
	struct vcache *c = &g_cache[cache_slot(v)];
	c->used = 1;
	c->kind = (unsigned char)kind;
	c->err = (uint16_t)err;
	c->a = *v;
	unlock(&ls);
}

/* ---- recipes: blocking connects through a gateway made here ---- */

#define MAX_RECIPES 64

struct ropt {
	uint16_t level, name;
	unsigned char kind, len;
	unsigned char val[RCP_OPTVAL];
};

struct recipe {
	unsigned char used, direct, nopts, acceptlen;
	int sockfam; /* the program socket's family it was made for */
	struct vaddr dst, gw;
	uint32_t wait_ms;
	uint16_t hellolen;
	struct ropt opts[RCP_OPTS];
	unsigned char hello[RCP_HELLO];
	unsigned char accept[RCP_ACCEPT];
};

static struct recipe g_recipes[MAX_RECIPES];

/* recipe_parse reads the agent's recipe (preload/recipe.go) for connects
 * to dst from sockets of family sockfam into *out; -1 if it is
 * malformed. */
static int recipe_parse(const struct vaddr *dst, int sockfam, const unsigned char *b, size_t n, struct recipe *out)
{
	struct recipe r;
	memset(&r, 0, sizeof r);
	if (n < VL_ADDR + 5 || get_addr(b, &r.gw) < 0)
		goto bad;
	size_t off = VL_ADDR;
	r.wait_ms = get32(b + off);
	r.nopts = b[off + 4];
	off += 5;
	if (r.nopts > RCP_OPTS)
		goto bad;
	for (int k = 0; k < r.nopts; k++) {
		struct ropt *o = &r.opts[k];
		if (off + 6 > n)
			goto bad;
		o->level = get16(b + off);
		o->name = get16(b + off + 2);
		o->kind = b[off + 4];
		o->len = b[off + 5];
		off += 6;
		if (o->len > RCP_OPTVAL || off + o->len > n || (o->kind != OPT_INT && o->kind != OPT_BYTES) ||
		    (o->kind == OPT_INT && o->len != 4))
			goto bad;
		memcpy(o->val, b + off, o->len);
		off += o->len;
	}
	if (off + 2 > n)
		goto bad;
	r.hellolen = get16(b + off);
	off += 2;
	if (r.hellolen > RCP_HELLO || off + r.hellolen + 1 > n)
		goto bad;
	memcpy(r.hello, b + off, r.hellolen);
	off += r.hellolen;
	r.acceptlen = b[off++];
	/* No hello and no accept: the address itself, with the options. */
	r.direct = r.hellolen == 0 && r.acceptlen == 0;
	if ((!r.direct && (r.hellolen == 0 || r.acceptlen == 0)) || r.acceptlen > RCP_ACCEPT ||
	    off + r.acceptlen != n)
		goto bad;
	memcpy(r.accept, b + off, r.acceptlen);
	r.used = 1;
	r.dst = *dst;
	r.sockfam = sockfam;
	*out = r;
	return 0;
bad:
	note("agent sent a malformed recipe; asking it about each connect");
	return -1;
}

/* recipe_keep keeps r for the next connects to its destination. */
static void recipe_keep(const struct recipe *r)
{
	lockstate ls;
	lock(&ls);
	g_recipes[cache_slot(&r->dst) % MAX_RECIPES] = *r;
	unlock(&ls);
}

/* recipe_load keeps the agent's recipe for connects to dst, if it is
 * well formed. */
static void recipe_load(const struct vaddr *dst, int sockfam, const unsigned char *b, size_t n)
{
	struct recipe r;
	if (recipe_parse(dst, sockfam, b, n, &r) == 0)
		recipe_keep(&r);
}

/* recipe_get copies the recipe for dst from a socket of family sockfam. */
static int recipe_get(const struct vaddr *dst, int sockfam, struct recipe *out)
{
	if (g_nocache)
		return 0;
	int ok = 0;
	lockstate ls;
	lock(&ls);
	struct recipe *r = &g_recipes[cache_slot(dst) % MAX_RECIPES];
	if (r->used && r->sockfam == sockfam && memcmp(&r->dst, dst, sizeof *dst) == 0) {
		*out = *r;
		ok = 1;
	}
	unlock(&ls);
	return ok;
}

static void recipe_forget(const struct vaddr *dst)
{
	lockstate ls;
	lock(&ls);
	struct recipe *r = &g_recipes[cache_slot(dst) % MAX_RECIPES];
	if (r->used && memcmp(&r->dst, dst, sizeof *dst) == 0)
		r->used = 0;
	unlock(&ls);
}

/* ---- connect ---- */

/* Options that must not follow a socket onto the agent's descriptor. */
static int replayable(const struct vopt *o)
{
	switch (o->level) {
	case SOL_SOCKET:
		return o->name != SO_BINDTODEVICE && o->name != SO_BINDTOIFINDEX;
	case IPPROTO_IP:
		return o->name != IP_FREEBIND && o->name != IP_TRANSPARENT && o->name != IP_BIND_ADDRESS_NO_PORT;
	case IPPROTO_IPV6:
		return o->name != IPV6_V6ONLY;
	case IPPROTO_TCP:
		return o->name != TCP_REPAIR && o->name != TCP_FASTOPEN_CONNECT;
	}
	return 0;
}

/* put_entry makes v fd's entry, with fd's socket inode. */
static void put_entry(int fd, struct vent *v)
{
	if (sock_ino(fd, &v->ino) < 0)
		return;
	lockstate ls;
	lock(&ls);
	struct vent *e = slot(fd, 1);
	if (e)
		*e = *v;
	unlock(&ls);
}

static void mark_redirected(int fd, const union vsockaddr *orig, socklen_t origlen, int held, uint64_t token)
{
	struct vent v;
	memset(&v, 0, sizeof v);
	v.state = ST_REDIRECTED;
	memcpy(&v.orig, orig, origlen);
	v.origlen = (unsigned char)origlen;
	v.held = (unsigned char)held;
	v.token = token;
	put_entry(fd, &v);
}

/* replace puts nfd in place of fd: same number, same close-on-exec flag
 * and status flags, and the options the program set on fd replayed. It
 * returns them in *e (*has: whether fd had any). */
static int replace(int fd, int nfd, struct vent *e, int *has)
{
	int fl = sys_fcntl(fd, F_GETFL, 0);
	int fdfl = sys_fcntl(fd, F_GETFD, 0);
	memset(e, 0, sizeof *e);
	*has = entry_copy(fd, ST_OPTS, e);
	if (sys_dup3(nfd, fd, (fdfl >= 0 && (fdfl & FD_CLOEXEC)) ? O_CLOEXEC : 0) < 0) {
		int err = errno;
		sys_close(nfd);
		errno = err;
		return -1;
	}
	sys_close(nfd);
	if (fl >= 0)
		sys_fcntl(fd, F_SETFL, fl);
	for (int k = 0; *has && k < e->nopts; k++)
		if (replayable(&e->opts[k]))
			sys_setsockopt(fd, e->opts[k].level, e->opts[k].name, e->opts[k].val, e->opts[k].len);
	return 0;
}

/* install puts the agent's connected descriptor nfd in place of fd
 * (replace). */
static int install(int fd, int nfd, const union vsockaddr *orig, socklen_t origlen)
{
	struct vent e;
	int has;
	if (replace(fd, nfd, &e, &has) < 0)
		return -1;
	mark_redirected(fd, orig, origlen, HELD_NO, 0);
	return 0;
}

/* renew puts a fresh socket in place of fd after a connect of the shim's
 * own failed or was interrupted: unconnected, as the program's was
 * before, with its number, flags and the options it set. */
static void renew(int fd, int sockfam)
{
	int type = 0, proto = 0;
	socklen_t tl = sizeof type, pl = sizeof proto;
	if (sys_getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) < 0 ||
	    sys_getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &pl) < 0)
		return;
	int nfd = socket(sockfam, type | SOCK_CLOEXEC, proto);
	if (nfd < 0)
		return;
	struct vent e;
	int has;
	if (replace(fd, nfd, &e, &has) == 0 && has)
		put_entry(fd, &e); /* the options, now of the new socket */
}

/* answer_errno shows the agent what a recipe's gateway answered instead
 * of the accept (or that the wait ran out): the errno of the refusal it
 * carries, 0 if it is none, or -1 if the agent cannot be asked. */
static int answer_errno(const struct vaddr *dst, int timedout, const unsigned char *b, size_t n)
{
	int i = get_chan();
	if (i < 0) {
		agent_down(errno);
		return -1;
	}
	unsigned char body[VL_ADDR + 1 + RCP_ANSWER];
	put_addr(body, dst);
	body[VL_ADDR] = (unsigned char)(timedout != 0);
	memcpy(body + VL_ADDR + 1, b, n);
	unsigned char rb[VL_MAXBODY];
	size_t rn;
	int ok = send_frame(i, M_ANSWER, body, VL_ADDR + 1 + n) == 0 &&
		 recv_frame(i, M_ERRNO, rb, VL_ERRNO, VL_ERRNO, &rn, NULL, 0) == 0;
	int e = errno;
	put_chan(i, ok);
	if (!ok) {
		agent_down(e);
		return -1;
	}
	int err = get16(rb);
	return err < 4096 ? err : ECONNREFUSED;
}

static long ms_since(const struct timespec *t0)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (t.tv_sec - t0->tv_sec) * 1000 + (t.tv_nsec - t0->tv_nsec) / 1000000;
}

/* recv_within reads into b[*n..max) until it holds want bytes, the peer
 * ends (*eof), or wait_ms from t0 pass (*late). A wait cut by a signal is
 * EINTR; a read's failure is its errno; 0 otherwise. */
static int recv_within(int fd, unsigned char *b, size_t *n, size_t want, const struct timespec *t0, long wait_ms,
		       int *eof, int *late)
{
	while (*n < want) {
		long left = wait_ms - ms_since(t0);
		if (left <= 0) {
			*late = 1;
			return 0;
		}
		struct pollfd pf = { fd, POLLIN, 0 };
		int k = poll(&pf, 1, left > INT_MAX ? INT_MAX : (int)left);
		if (k < 0)
			return errno;
		if (k == 0)
			continue;
		ssize_t m = recv(fd, b + *n, want - *n, MSG_DONTWAIT);
		if (m < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				continue;
			return errno == EINTR ? EINTR : errno;
		}
		if (m == 0) {
			*eof = 1;
			return 0;
		}
		*n += (size_t)m;
	}
	return 0;
}

#define RC_ASK (-2)

/* own_socket reports whether fd can take a recipe: unbound, and the shim
 * knowing every option the program set on it (to leave those alone), so
 * that the agent's way can still take it over if the recipe fails.
 * Through a gateway (direct 0), its options must also all be of the kind
 * that follow it onto the agent's. */
static int own_socket(int fd, int direct)
{
	struct vent e;
	int has = entry_any(fd, &e);
	if (has && (e.state != ST_OPTS || e.nopts >= MAX_OPTS))
		return 0;
	for (int k = 0; has && !direct && k < e.nopts; k++)
		if (!replayable(&e.opts[k]))
			return 0;
	union vsockaddr la;
	socklen_t ll = sizeof la;
	return sys_getsockname(fd, &la.sa, &ll) == 0 &&
	       (la.sa.sa_family == AF_INET ? la.in4.sin_port : la.in6.sin6_port) == 0;
}

static int recipe_run(int fd, const struct sockaddr *sa, socklen_t len, const struct vaddr *dst, int sockfam,
		      int saved, const struct recipe *r);

/* recipe_connect makes a connect to dst on the program's own socket as
 * the agent's recipe for dst says, if it has one that fits (recipe_run):
 * a direct one for any connect, one through a gateway for a blocking
 * connect. RC_ASK: there is none, or the socket cannot take it (see
 * own_socket), and the socket is as the program left it. */
static int recipe_connect(int fd, const struct sockaddr *sa, socklen_t len, const struct vaddr *dst, int sockfam,
			  int saved, int held)
{
	struct recipe r;
	if (!recipe_get(dst, sockfam, &r) || (held && !r.direct) || !own_socket(fd, r.direct))
		return RC_ASK;
	return recipe_run(fd, sa, len, dst, sockfam, saved, &r);
}

/* recipe_run makes a connect to dst on the program's own socket, which
 * own_socket took, as recipe *r says (preload/recipe.go): the agent's
 * socket options where the program set none of its own, then, for a
 * direct recipe, the connect itself, as the kernel makes it (blocking,
 * timed or not); otherwise a connect to the gateway, the hello, and
 * exactly the accept in answer. It returns 0, connected; -1 with errno:
 * the kernel's for a direct recipe; the refusal the gateway's answer
 * carries (as the agent reads it), ETIMEDOUT, EINTR, a read's error; or
 * RC_ASK: the recipe no longer holds (an option the socket does not
 * take, a gateway gone), and the socket is as the program left it. A
 * failed connect through a gateway leaves a fresh socket in fd's place,
 * unconnected, as the agent's way leaves the program's. */
static int recipe_run(int fd, const struct sockaddr *sa, socklen_t len, const struct vaddr *dst, int sockfam,
		      int saved, const struct recipe *r)
{
	struct vent e;
	int has = entry_any(fd, &e);
	for (int k = 0; k < r->nopts; k++) {
		const struct ropt *o = &r->opts[k];
		int mine = 0;
		for (int j = 0; has && j < e.nopts && !mine; j++)
			mine = e.opts[j].level == o->level && e.opts[j].name == o->name;
		if (mine)
			continue; /* the program's own, replayed over the agent's on its way too */
		int v = (int)get32(o->val);
		int ok = o->kind == OPT_INT ? sys_setsockopt(fd, o->level, o->name, &v, sizeof v) :
					      sys_setsockopt(fd, o->level, o->name, o->val, o->len);
		if (ok < 0) {
			renew(fd, sockfam);
			return RC_ASK;
		}
	}
	if (r->direct) {
		/* The program's own connect: what the kernel says is what it
		 * would hear without the shim, and a refusal is the far
		 * side's, which leaves the recipe as it was. */
		int rc = sys_connect(fd, sa, len);
		if (rc == 0) {
			debugf("connect fd %d: direct, with the agent's options", fd);
			errno = saved;
		}
		return rc;
	}
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	union vsockaddr ga;
	socklen_t gl = from_vaddr(&r->gw, sockfam, &ga);
	if (sys_connect(fd, &ga.sa, gl) < 0) {
		int err = errno;
		renew(fd, sockfam);
		if (err == EINTR) {
			errno = EINTR;
			return -1;
		}
		recipe_forget(dst); /* the gateway is gone or moved: the agent says what now */
		return RC_ASK;
	}
	/* A new connection's send buffer takes a hello whole. */
	if (send(fd, r->hello, r->hellolen, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)r->hellolen) {
		renew(fd, sockfam);
		recipe_forget(dst);
		return RC_ASK;
	}
	unsigned char got[RCP_ANSWER];
	size_t n = 0;
	int eof = 0, late = 0;
	int rerr = recv_within(fd, got, &n, r->acceptlen, &t0, (long)r->wait_ms, &eof, &late);
	if (rerr == 0 && n == r->acceptlen && memcmp(got, r->accept, n) == 0) {
		union vsockaddr orig;
		socklen_t origlen = len < sizeof orig ? len : sizeof orig;
		memcpy(&orig, sa, origlen);
		mark_redirected(fd, &orig, origlen, HELD_NO, 0);
		debugf("connect fd %d: through the gateway, by the agent's recipe", fd);
		errno = saved;
		return 0;
	}
	if (rerr == 0 && !eof && !late) {
		/* Not the accept: a refusal, and the gateway's end after it.
		 * What follows comes at once, or not at all. */
		struct timespec t1;
		clock_gettime(CLOCK_MONOTONIC, &t1);
		rerr = recv_within(fd, got, &n, sizeof got, &t1, 200, &eof, &late);
		late = 0;
	}
	renew(fd, sockfam);
	if (rerr != 0) {
		debugf("connect fd %d: the gateway's answer: %s", fd, strerror(rerr));
		errno = rerr;
		return -1;
	}
	int err = answer_errno(dst, late, got, n);
	if (err == 0) {
		recipe_forget(dst); /* an answer of another kind: the agent's way */
		return RC_ASK;
	}
	if (err < 0) {
		errno = ENETUNREACH;
		return -1;
	}
	debugf("connect fd %d: %s (the gateway's answer)", fd, strerror(err));
	errno = err;
	return -1;
}

/* relay_connect connects the program's socket to the agent's relay
 * listener (a blocking connect, dialed already) or its held listener (a
 * non-blocking one: the socket stays in SYN-SENT until the agent's dial
 * ends, preload/held_linux.go), and tells the agent which token the
 * connection is for. */
static int relay_connect(int i, int fd, int sockfam, uint64_t token, int held)
{
	union vsockaddr ra;
	socklen_t rl;
	struct vaddr lo = { 4, held ? g_w.held4 : g_w.relay4, { 127, 0, 0, 1 } };
	if (sockfam == AF_INET6) {
		int v6only = 0;
		socklen_t ol = sizeof v6only;
		sys_getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, &ol);
		if (v6only) {
			uint16_t port = held ? g_w.held6 : g_w.relay6;
			if (port == 0) {
				errno = ENETUNREACH;
				return -1;
			}
			memset(&lo, 0, sizeof lo);
			lo.fam = 6;
			lo.port = port;
			lo.ip[15] = 1;
		}
	}
	rl = from_vaddr(&lo, sockfam, &ra);
	int r = sys_connect(fd, &ra.sa, rl);
	if (r < 0 && errno != EINPROGRESS)
		return -1;
	int e = errno;
	union vsockaddr la;
	socklen_t ll = sizeof la;
	struct vaddr local;
	if (sys_getsockname(fd, &la.sa, &ll) < 0 || to_vaddr(&la.sa, ll, &local) < 0)
		return -1;
	unsigned char b[VL_ATTACH];
	put64(b, token);
	put_addr(b + 8, &local);
	if (send_frame(i, M_ATTACH, b, sizeof b) < 0)
		return -1;
	errno = e;
	return r;
}

/* known_verdict decides a real address without the agent when the
 * welcome, the IP table or the cache can: R_DIRECT, R_ERROR (with *err),
 * or 0 to ask. */
static int known_verdict(const struct vaddr *dst, int *err)
{
	if (__atomic_load_n(&g_w.known, __ATOMIC_ACQUIRE) && (g_w.flags & WELCOME_IPS_DIRECT))
		return R_DIRECT;
	switch (iptable_eval(dst)) {
	case IP_DIRECT:
		return R_DIRECT;
	case IP_REFUSE:
		*err = EPERM;
		return R_ERROR;
	}
	return cache_get(dst, err);
}

/* settle does what a verdict known without the agent says: connect
 * direct, or fail with err. */
static int settle(int verdict, int err, int fd, const struct sockaddr *sa, socklen_t len)
{
	if (verdict == R_DIRECT)
		return sys_connect(fd, sa, len);
	errno = err;
	return -1;
}

/* ask_chan takes a channel to ask the agent about dst. It returns the
 * channel; or -1, failing closed with ENETUNREACH, when there is none; or
 * -2 when the welcome the channel brought decides a real address after
 * all (*verdict, *err: see known_verdict). */
static int ask_chan(const struct vaddr *dst, int fake, int *verdict, int *err)
{
	int i = get_chan();
	if (i < 0) {
		agent_down(errno);
		errno = ENETUNREACH;
		return -1;
	}
	if (!fake && (*verdict = known_verdict(dst, err)) != 0) {
		put_chan(i, 1);
		return -2;
	}
	return i;
}

/* stream_socket reports whether fd is a TCP (or MPTCP) socket. */
static int stream_socket(int fd, int *is_stream)
{
	int type = 0, proto = 0;
	socklen_t tl = sizeof type, pl = sizeof proto;
	if (sys_getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) < 0)
		return -1;
	*is_stream = 0;
	if (type == SOCK_STREAM && sys_getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &pl) == 0)
		*is_stream = proto == IPPROTO_TCP || proto == IPPROTO_MPTCP;
	return 0;
}

/* udp_socket reports whether fd is a UDP socket. */
static int udp_socket(int fd)
{
	int type = 0, proto = 0;
	socklen_t tl = sizeof type, pl = sizeof proto;
	return sys_getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) == 0 && type == SOCK_DGRAM &&
	       sys_getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &pl) == 0 && proto == IPPROTO_UDP;
}

static int all_zero(const unsigned char *b, size_t n)
{
	for (size_t k = 0; k < n; k++)
		if (b[k])
			return 0;
	return 1;
}

/* ask_datagram decides where fd's datagrams to dst go. It returns
 * R_DIRECT (as written), R_DGRAM with the address of a relay the agent
 * opened for them in *ra and *rl (binding fd first if it has no port, as
 * sending or connect would), or -1 with errno set (a refusal, or no
 * agent: never direct). The relay takes datagrams from fd's address
 * alone (preload/datagram_linux.go). */
static int ask_datagram(int fd, const struct vaddr *dst, int sockfam, union vsockaddr *ra, socklen_t *rl)
{
	int fake = is_fake(dst), err = 0, verdict;
	if (!fake && (verdict = known_verdict(dst, &err)) != 0)
		goto known;
	union vsockaddr la;
	socklen_t ll = sizeof la;
	struct vaddr local;
	if (sys_getsockname(fd, &la.sa, &ll) < 0 || to_vaddr(&la.sa, ll, &local) < 0)
		return -1;
	if (local.port == 0) {
		union vsockaddr any;
		memset(&any, 0, sizeof any);
		any.sa.sa_family = (sa_family_t)sockfam;
		if (sys_bind(fd, &any.sa, sockfam == AF_INET6 ? sizeof any.in6 : sizeof any.in4) < 0)
			return -1;
		ll = sizeof la;
		if (sys_getsockname(fd, &la.sa, &ll) < 0 || to_vaddr(&la.sa, ll, &local) < 0)
			return -1;
	}
	/* The relay's family: IPv6 loopback for a socket that cannot reach
	 * IPv4 or is bound to an IPv6 address, else 127.0.0.1. */
	int rfam = 4;
	if (sockfam == AF_INET6) {
		int v6only = 0;
		socklen_t ol = sizeof v6only;
		sys_getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, &ol);
		if (v6only || (local.fam == 6 && !all_zero(local.ip, 16)))
			rfam = 6;
	}
	/* Where the relay sees the socket: its own address, or loopback for
	 * a wildcard one (the kernel's source toward a loopback relay). */
	if (all_zero(local.ip, 16)) {
		memset(local.ip, 0, sizeof local.ip);
		local.fam = (unsigned char)rfam;
		if (rfam == 4)
			local.ip[0] = 127, local.ip[3] = 1;
		else
			local.ip[15] = 1;
	}
	int i = ask_chan(dst, fake, &verdict, &err);
	if (i == -2)
		goto known;
	if (i < 0)
		return -1;
	unsigned char b[VL_MAXBODY];
	size_t n;
	put_addr(b, dst);
	b[VL_ADDR] = (unsigned char)rfam;
	put_addr(b + VL_ADDR + 1, &local);
	if (send_frame(i, M_DATAGRAM, b, VL_DATAGRAM) < 0 ||
	    recv_frame(i, M_RESULT, b, VL_RESULT, VL_RESULT, &n, NULL, 0) < 0) {
		int e = errno;
		put_chan(i, 0);
		agent_down(e);
		errno = ENETUNREACH;
		return -1;
	}
	put_chan(i, 1);
	int kind = b[0], flags = b[1];
	err = get16(b + 2);
	uint64_t port = get64(b + 4);
	switch (kind) {
	case R_DIRECT:
		if ((flags & RESULT_CACHE) && !fake)
			cache_put(dst, R_DIRECT, 0);
		return R_DIRECT;
	case R_ERROR:
		if (err <= 0 || err > 4095)
			err = ENETUNREACH;
		if ((flags & RESULT_CACHE) && !fake)
			cache_put(dst, R_ERROR, err);
		errno = err;
		return -1;
	case R_DGRAM:
		if (port == 0 || port > 65535)
			break;
		struct vaddr lo;
		memset(&lo, 0, sizeof lo);
		lo.fam = (unsigned char)rfam;
		lo.port = (uint16_t)port;
		if (rfam == 4)
			lo.ip[0] = 127, lo.ip[3] = 1;
		else
			lo.ip[15] = 1;
		*rl = from_vaddr(&lo, sockfam, ra);
		return R_DGRAM;
	}
	note("agent sent an unknown datagram result kind %d", kind);
	errno = ENETUNREACH;
	return -1;
known:
	if (verdict == R_DIRECT)
		return R_DIRECT;
	errno = err;
	return -1;
}

/* orig_of records sa, as the program wrote it, for recvfrom to return: an
 * address of the socket's family, of its full size. */
static socklen_t orig_of(const struct sockaddr *sa, socklen_t len, union vsockaddr *orig)
{
	socklen_t full = sa->sa_family == AF_INET ? sizeof orig->in4 : sizeof orig->in6;
	memset(orig, 0, sizeof *orig);
	memcpy(orig, sa, len < full ? len : full);
	return full;
}

/* route_datagram does what the agent says of a UDP socket's connect: a
 * routed destination's socket is connected to its relay instead. */
static int route_datagram(int fd, const struct sockaddr *sa, socklen_t len, const struct vaddr *dst, int sockfam,
			  int saved)
{
	forget(fd); /* a connect replaces the socket's association, as the kernel's does */
	union vsockaddr ra;
	socklen_t rl;
	switch (ask_datagram(fd, dst, sockfam, &ra, &rl)) {
	case R_DIRECT:
		debugf("connect fd %d (UDP): direct", fd);
		return sys_connect(fd, sa, len);
	case R_DGRAM:
		break;
	default:
		debugf("connect fd %d (UDP): %s", fd, strerror(errno));
		return -1;
	}
	if (sys_connect(fd, &ra.sa, rl) < 0)
		return -1;
	struct vaddr relay;
	to_vaddr(&ra.sa, rl, &relay);
	struct vent v;
	memset(&v, 0, sizeof v);
	v.state = ST_REDIRECTED;
	v.origlen = (unsigned char)orig_of(sa, len, &v.orig);
	v.dgram = 1;
	v.token = relay.port;
	put_entry(fd, &v);
	debugf("connect fd %d (UDP): relayed by port %u", fd, relay.port);
	errno = saved;
	return 0;
}

/* Unconnected UDP sockets: a datagram sent with the address of a routed
 * destination goes to a relay of its own for that socket and destination,
 * and what the relay sends back shows as from the destination. The table
 * is the process's, by the socket's inode; when full, the oldest entry
 * makes room (its relay's answers then show the relay's address). It is
 * looked up on every such datagram, both ways, so readers take no lock:
 * writers (under g_lock, once per new destination) make g_useq odd while
 * they write, and a reader retries if it changed under it (a seqlock). */
#define MAX_UDPMAP 256

struct udpmap {
	ino_t ino; /* 0: free */
	uint16_t port; /* the relay's */
	struct vaddr dst;
	union vsockaddr orig, relay; /* the destination as the program wrote it; the relay as sendto takes it */
	socklen_t origlen, relaylen;
};

static struct udpmap g_umap[MAX_UDPMAP];
static unsigned g_unext, g_used;
static unsigned g_useq;

/* umap_find copies the entry of socket ino with destination dst (port 0)
 * or with relay port (dst NULL); 0 if there is none. */
static int umap_find(ino_t ino, const struct vaddr *dst, uint16_t port, struct udpmap *out)
{
	for (;;) {
		unsigned seq = __atomic_load_n(&g_useq, __ATOMIC_ACQUIRE);
		if (seq & 1) {
			sched_yield(); /* a writer, for a moment */
			continue;
		}
		int ok = 0;
		struct udpmap m;
		unsigned n = __atomic_load_n(&g_used, __ATOMIC_RELAXED);
		for (unsigned k = 0; k < n && !ok; k++) {
			memcpy(&m, &g_umap[k], sizeof m);
			ok = m.ino == ino && (dst ? memcmp(&m.dst, dst, sizeof *dst) == 0 : m.port == port);
		}
		__atomic_thread_fence(__ATOMIC_ACQUIRE);
		if (__atomic_load_n(&g_useq, __ATOMIC_RELAXED) != seq)
			continue;
		if (ok)
			*out = m; /* out is left alone on a miss: callers fill it in */
		return ok;
	}
}

static void umap_put(const struct udpmap *m)
{
	lockstate ls;
	lock(&ls);
	__atomic_store_n(&g_useq, g_useq + 1, __ATOMIC_RELAXED);
	__atomic_thread_fence(__ATOMIC_RELEASE);
	unsigned k = g_used;
	if (k < MAX_UDPMAP)
		__atomic_store_n(&g_used, k + 1, __ATOMIC_RELAXED);
	else
		k = g_unext++ % MAX_UDPMAP;
	g_umap[k] = *m;
	__atomic_store_n(&g_useq, g_useq + 1, __ATOMIC_RELEASE);
	unlock(&ls);
}

/* relay_dest decides where a datagram fd sends to sa goes: 0 as written;
 * 1 to the relay of fd and that destination, whose address it puts in ra
 * and rl (asking the agent the first time); -1 nowhere, with errno. */
static int relay_dest(int fd, const struct sockaddr *sa, socklen_t len, union vsockaddr *ra, socklen_t *rl)
{
	struct vaddr dst;
	int err = 0, domain = 0;
	socklen_t dl = sizeof domain;
	struct udpmap m;
	if (len < sizeof(sa_family_t) || (sa->sa_family != AF_INET && sa->sa_family != AF_INET6) ||
	    to_vaddr(sa, len, &dst) < 0)
		return 0;
	if (entry_state(fd) == ST_UDPMAP && sock_ino(fd, &m.ino) == 0 && umap_find(m.ino, &dst, 0, &m)) {
		/* A destination this socket sent to before: no question. */
		*ra = m.relay;
		*rl = m.relaylen;
		return 1;
	}
	if (!is_fake(&dst)) {
		switch (known_verdict(&dst, &err)) {
		case R_DIRECT:
			return 0;
		case R_ERROR:
			errno = err;
			return -1;
		}
	}
	if (!udp_socket(fd)) {
		int stream = 0;
		if (is_fake(&dst) && stream_socket(fd, &stream) == 0 && !stream)
			return no_datagrams(); /* ICMP, say: no datagram path to a far-side name */
		return 0;
	}
	if (sys_getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &dl) < 0 || domain != sa->sa_family)
		return 0; /* the kernel says what it says */
	memset(&m, 0, sizeof m);
	if (sock_ino(fd, &m.ino) < 0)
		return 0;
	if (umap_find(m.ino, &dst, 0, &m)) {
		*ra = m.relay;
		*rl = m.relaylen;
		return 1;
	}
	switch (ask_datagram(fd, &dst, domain, ra, rl)) {
	case R_DIRECT:
		return 0;
	case R_DGRAM:
		break;
	default:
		return -1;
	}
	struct vaddr relay;
	to_vaddr(&ra->sa, *rl, &relay);
	m.port = relay.port;
	m.dst = dst;
	m.origlen = orig_of(sa, len, &m.orig);
	m.relay = *ra;
	m.relaylen = *rl;
	umap_put(&m);
	/* recvfrom's cue to look the relay up (options recorded for a TCP
	 * connect do not matter here). */
	lockstate ls;
	lock(&ls);
	struct vent *e = valid(fd);
	int mark = !e || e->state == ST_OPTS;
	unlock(&ls);
	if (mark) {
		struct vent v;
		memset(&v, 0, sizeof v);
		v.state = ST_UDPMAP;
		put_entry(fd, &v);
	}
	debugf("sendto on fd %d (UDP): relayed by port %u", fd, relay.port);
	return 1;
}

static int timed_wait(int fd, uint32_t ms, int saved);

/* route_connect asks the agent about a TCP connect and does what it says. */
static int route_connect(int fd, const struct sockaddr *sa, socklen_t len, const struct vaddr *dst, int saved)
{
	int fake = is_fake(dst), err = 0, verdict;
	if (!fake && (verdict = known_verdict(dst, &err)) != 0)
		return settle(verdict, err, fd, sa, len);
	int sockfam = 0;
	socklen_t ol = sizeof sockfam;
	if (sys_getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &sockfam, &ol) < 0)
		return -1;
	int fl = sys_fcntl(fd, F_GETFL, 0);
	if (fl < 0)
		return -1;
	int nonblock = (fl & O_NONBLOCK) != 0;
	uint32_t timeout_ms = 0;
	if (!nonblock) {
		struct timeval tv;
		socklen_t tl = sizeof tv;
		if (sys_getsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, &tl) == 0 && (tv.tv_sec > 0 || tv.tv_usec > 0))
			timeout_ms = (uint32_t)(tv.tv_sec * 1000 + tv.tv_usec / 1000 + 1);
	}
	/* A blocking connect with SO_SNDTIMEO returns EINPROGRESS when its
	 * time runs out and goes on in the background: it is held as a
	 * non-blocking one is, and waited for within the time (timed_wait). */
	int timed = timeout_ms > 0, held = nonblock || timed;
	if (!fake) {
		int r = recipe_connect(fd, sa, len, dst, sockfam, saved, held);
		if (r != RC_ASK)
			return r;
	}

	/* A held socket that can take a route's options and connect itself
	 * says so: for a route that is only that, the agent answers with a
	 * direct recipe instead of holding and relaying it. */
	int own = !fake && held && own_socket(fd, 1);
ask:;
	int i = ask_chan(dst, fake, &verdict, &err);
	if (i == -2)
		return settle(verdict, err, fd, sa, len);
	if (i < 0)
		return -1;
	unsigned char b[VL_MAXBODY];
	size_t n;
	int nfd = -1;
	put_addr(b, dst);
	b[VL_ADDR] = sockfam == AF_INET6 ? 6 : 4;
	b[VL_ADDR + 1] = (held ? MODE_ASYNC : MODE_SYNC) | (own ? MODE_OWN : 0);
	put32(b + VL_ADDR + 2, 0); /* the dial goes on past a timed connect's time, as the kernel's */
	if (send_frame(i, M_CONNECT, b, VL_CONNECT) < 0 ||
	    recv_frame(i, M_RESULT, b, VL_RESULT, VL_RESULT, &n, &nfd, !nonblock) < 0) {
		int e = errno;
		put_chan(i, 0);
		if (e == EINTR) {
			errno = EINTR;
			return -1;
		}
		agent_down(e);
		errno = ENETUNREACH;
		return -1;
	}
	int kind = b[0], flags = b[1];
	err = get16(b + 2);
	uint64_t token = get64(b + 4);
	union vsockaddr orig;
	socklen_t origlen = len < sizeof orig ? len : sizeof orig;
	memcpy(&orig, sa, origlen);
	if (kind != R_FD && nfd >= 0) {
		sys_close(nfd);
		nfd = -1;
	}
	switch (kind) {
	case R_DIRECT:
		if (flags & RESULT_RECIPE) {
			/* The route's options, for this connect and the next. */
			unsigned char rb[VL_MAXBODY];
			size_t rn;
			struct recipe r;
			if (recv_frame(i, M_RECIPE, rb, VL_ADDR + 5, VL_MAXBODY, &rn, NULL, 0) < 0) {
				put_chan(i, 0);
				agent_down(errno);
				errno = ENETUNREACH;
				return -1;
			}
			put_chan(i, 1);
			if (recipe_parse(dst, sockfam, rb, rn, &r) < 0 || !r.direct) {
				errno = ENETUNREACH;
				return -1;
			}
			if (!g_nocache)
				recipe_keep(&r);
			int rc = recipe_run(fd, sa, len, dst, sockfam, saved, &r);
			if (rc != RC_ASK)
				return rc;
			own = 0; /* an option it does not take: the agent's way says why */
			goto ask;
		}
		put_chan(i, 1);
		if ((flags & RESULT_CACHE) && !fake)
			cache_put(dst, R_DIRECT, 0);
		debugf("connect fd %d: direct", fd);
		return sys_connect(fd, sa, len);
	case R_ERROR:
		put_chan(i, 1);
		if (err <= 0 || err > 4095)
			err = ECONNREFUSED;
		if ((flags & RESULT_CACHE) && !fake)
			cache_put(dst, R_ERROR, err);
		debugf("connect fd %d: %s", fd, strerror(err));
		errno = err;
		return -1;
	case R_FD:
		if (flags & RESULT_RECIPE) {
			unsigned char rb[VL_MAXBODY];
			size_t rn;
			if (recv_frame(i, M_RECIPE, rb, VL_ADDR + 5, VL_MAXBODY, &rn, NULL, 0) < 0) {
				put_chan(i, 0); /* the descriptor came: the connect stands */
				i = -1;
			} else if (!fake) {
				recipe_load(dst, sockfam, rb, rn);
			}
		}
		if (i >= 0)
			put_chan(i, 1);
		if (nfd < 0) {
			note("agent promised a descriptor and sent none");
			errno = ECONNREFUSED;
			return -1;
		}
		if (install(fd, nfd, &orig, origlen) < 0)
			return -1;
		debugf("connect fd %d: descriptor from the agent", fd);
		errno = saved;
		return 0;
	case R_RELAY: {
		if (timed)
			sys_fcntl(fd, F_SETFL, fl | O_NONBLOCK);
		int r = relay_connect(i, fd, sockfam, token, held);
		int e = errno;
		if (timed)
			sys_fcntl(fd, F_SETFL, fl);
		put_chan(i, r == 0 || e == EINPROGRESS);
		if (r < 0 && e != EINPROGRESS) {
			errno = e;
			return -1;
		}
		mark_redirected(fd, &orig, origlen, held ? HELD_PENDING : HELD_NO, token);
		debugf("connect fd %d: relayed (%s)", fd, r < 0 ? "in progress" : "connected");
		if (timed && r < 0)
			return timed_wait(fd, timeout_ms, saved);
		errno = r < 0 ? e : saved;
		return r;
	}
	}
	put_chan(i, 0);
	note("agent sent an unknown result kind %d", kind);
	errno = ECONNREFUSED;
	return -1;
}

/* A held connect (preload/held_linux.go) wakes once the agent's dial
 * ended: connected to the agent when the dial succeeded, reset before it
 * ever connected when the dial failed. A reset is asked about once: the
 * agent keeps the dial's errno. */
/* held_state returns fd's held state and token. */
static int held_state(int fd, uint64_t *token)
{
	struct vent e;
	if (!entry_copy(fd, ST_REDIRECTED, &e))
		return HELD_NO;
	*token = e.token;
	return e.held;
}

static void held_set(int fd, int st)
{
	lockstate ls;
	lock(&ls);
	struct vent *e = valid(fd);
	if (e && e->state == ST_REDIRECTED)
		e->held = (unsigned char)st;
	unlock(&ls);
}

/* held_why asks the agent why the held connect of token was reset: the
 * dial's errno, or 0 (a connection that had succeeded and was reset later,
 * or no answer): the kernel's word then stands. */
static int held_why(uint64_t token)
{
	int was = t_busy, why = 0;
	t_busy = 1;
	int i = get_chan();
	if (i >= 0) {
		unsigned char b[VL_MAXBODY];
		size_t n;
		put64(b, token);
		int ok = send_frame(i, M_WHY, b, VL_WHY) == 0 &&
			 recv_frame(i, M_ERRNO, b, VL_ERRNO, VL_ERRNO, &n, NULL, 0) == 0;
		put_chan(i, ok);
		if (ok && get16(b) < 4096)
			why = get16(b);
	}
	t_busy = was;
	return why;
}

/* woke reports whether fd's connect is no longer in progress. */
static int woke(int fd)
{
	struct tcp_info ti;
	socklen_t tl = sizeof ti;
	if (sys_getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) < 0)
		return 1;
	return ti.tcpi_state != TCP_SYN_SENT && ti.tcpi_state != TCP_SYN_RECV;
}

/* held_error turns what the kernel says of a held socket (e: SO_ERROR's
 * value, or a second connect's errno, 0 for connected) into what the
 * program would have seen without the shim: the dial's errno when it
 * failed. */
static int held_error(int fd, int e)
{
	uint64_t token = 0;
	if (held_state(fd, &token) != HELD_PENDING)
		return e;
	switch (e) {
	case EALREADY:
	case EINPROGRESS:
		return e;
	case 0:
		if (woke(fd))
			held_set(fd, HELD_NO); /* connected: the dial succeeded */
		return e;
	case ECONNRESET: {
		held_set(fd, HELD_NO);
		int why = held_why(token);
		return why ? why : e;
	}
	}
	held_set(fd, HELD_NO); /* EISCONN, or the kernel's own verdict (its SYN timed out) */
	return e;
}

/* timed_wait waits for a held connect of a blocking socket with
 * SO_SNDTIMEO, for up to ms, as the kernel's connect does: 0 once
 * connected; -1 with the dial's errno if it failed, with EINPROGRESS if
 * the time ran out (the connect goes on: the program polls, or connects
 * again), with EINTR if a signal came first. */
static int timed_wait(int fd, uint32_t ms, int saved)
{
	struct pollfd p = { fd, POLLOUT, 0 };
	int r = poll(&p, 1, ms > INT_MAX ? INT_MAX : (int)ms);
	if (r < 0)
		return -1;
	if (r == 0) {
		errno = EINPROGRESS;
		return -1;
	}
	int err = 0;
	socklen_t l = sizeof err;
	if (sys_getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l) < 0)
		return -1;
	if ((err = held_error(fd, err)) != 0) {
		errno = err;
		return -1;
	}
	errno = saved;
	return 0;
}

/* quick_direct reports whether a TCP connect to dst is known to be direct
 * without asking the agent. */
static int quick_direct(const struct vaddr *dst)
{
	if (is_fake(dst))
		return 0;
	if (__atomic_load_n(&g_w.known, __ATOMIC_ACQUIRE) && (g_w.flags & WELCOME_IPS_DIRECT))
		return 1;
	if (iptable_eval(dst) == IP_DIRECT)
		return 1;
	int err;
	return cache_get(dst, &err) == R_DIRECT;
}

static void init(void);

static void ensure_init(void)
{
	pthread_once(&g_once, init);
}

EXPORT int connect(int fd, const struct sockaddr *sa, socklen_t len)
{
	int saved = errno;
	ensure_init();
	if (sa == NULL || len < sizeof(sa_family_t))
		return sys_connect(fd, sa, len);
	int fam = sa->sa_family;
	if (fam == AF_UNSPEC) {
		forget(fd); /* dissolves the association, as the kernel does */
		return sys_connect(fd, sa, len);
	}
	struct vaddr dst;
	if ((fam != AF_INET && fam != AF_INET6) || to_vaddr(sa, len, &dst) < 0)
		return sys_connect(fd, sa, len);
	int stream, domain = 0;
	socklen_t dl = sizeof domain;
	if (stream_socket(fd, &stream) < 0 || sys_getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &dl) < 0 ||
	    domain != fam)
		return sys_connect(fd, sa, len); /* EBADF, ENOTSOCK, EAFNOSUPPORT: the kernel says it */
	if (!stream) {
		if (!udp_socket(fd)) {
			if (is_fake(&dst))
				return no_datagrams(); /* no datagram path to a far-side name */
			return sys_connect(fd, sa, len);
		}
		int was = t_busy;
		t_busy = 1;
		int r = route_datagram(fd, sa, len, &dst, domain, saved);
		t_busy = was;
		if (r == 0)
			errno = saved;
		return r;
	}
	int redirected = 0;
	if (has_entry(fd)) {
		lockstate ls;
		lock(&ls);
		struct vent *e = valid(fd);
		redirected = e && e->state == ST_REDIRECTED;
		unlock(&ls);
	}
	if (redirected) {
		/* A second connect: the kernel answers for the socket as it is
		 * (EALREADY, EISCONN, or 0 once), whatever the address; a held
		 * connect whose dial failed gets the dial's errno. */
		errno = saved;
		int r = sys_connect(fd, sa, len);
		int e = held_error(fd, r == 0 ? 0 : errno);
		if (e == 0 || (r < 0 && e == errno)) {
			errno = r == 0 ? saved : e;
			return r;
		}
		errno = e;
		return -1;
	}
	int was = t_busy;
	t_busy = 1;
	int r = route_connect(fd, sa, len, &dst, saved);
	t_busy = was;
	if (r == 0)
		errno = saved;
	return r;
}

/* ---- descriptor life cycle ---- */

EXPORT int close(int fd)
{
	ensure_init();
	if (ours(fd)) {
		errno = EBADF; /* the program never had it */
		return -1;
	}
	forget(fd);
	return sys_close(fd);
}

/* our_fds_in lists the shim's descriptors within [first, last], sorted. */
static int our_fds_in(unsigned int first, unsigned int last, int *out)
{
	int n = 0;
	for (int i = 0; i < MAX_CH; i++) {
		int fd = ch_fd(i);
		if (fd >= 0 && (unsigned int)fd >= first && (unsigned int)fd <= last)
			out[n++] = fd;
	}
	for (int a = 1; a < n; a++)
		for (int b = a; b > 0 && out[b - 1] > out[b]; b--) {
			int t = out[b];
			out[b] = out[b - 1];
			out[b - 1] = t;
		}
	return n;
}

static int close_range_sparing(unsigned int first, unsigned int last, int flags)
{
	int keep[MAX_CH];
	int n = our_fds_in(first, last, keep);
	if (!(flags & CLOSE_RANGE_CLOEXEC))
		forget_range(first, last);
	unsigned int lo = first;
	int r = 0;
	for (int k = 0; k < n; k++) {
		unsigned int o = (unsigned int)keep[k];
		if (o > lo && sys_close_range(lo, o - 1, flags) < 0)
			r = -1;
		lo = o + 1;
	}
	if (lo <= last && lo != 0 && sys_close_range(lo, last, flags) < 0)
		r = -1;
	return r;
}

EXPORT int close_range(unsigned int first, unsigned int last, int flags)
{
	ensure_init();
	if (first > last)
		return sys_close_range(first, last, flags); /* EINVAL from the kernel */
	return close_range_sparing(first, last, flags);
}

EXPORT void closefrom(int lowfd)
{
	ensure_init();
	int saved = errno;
	if (lowfd < 0)
		lowfd = 0;
	if (close_range_sparing((unsigned int)lowfd, ~0U, 0) < 0 && errno == ENOSYS) {
		/* A kernel without close_range: close one by one, as glibc does. */
		struct rlimit rl;
		long max = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? (long)rl.rlim_cur
											  : 65536;
		for (long fd = lowfd; fd < max; fd++)
			if (!ours((int)fd)) {
				forget((int)fd);
				sys_close((int)fd);
			}
	}
	errno = saved;
}

/* relocate moves the shim's descriptor fd out of the way of a dup2 onto
 * that number. */
static void relocate(int fd)
{
	lockstate ls;
	lock(&ls);
	if (getpid() == g_pid) { /* not in a vfork child, which shares our memory */
		for (int i = 0; i < MAX_CH; i++) {
			if (g_ch[i].fd != fd)
				continue;
			int nfd = sys_fcntl(fd, F_DUPFD_CLOEXEC, g_fdbase);
			if (nfd == fd || nfd < 0)
				nfd = sys_fcntl(fd, F_DUPFD_CLOEXEC, 3);
			__atomic_store_n(&g_ch[i].fd, nfd, __ATOMIC_RELAXED);
		}
	}
	unlock(&ls);
}

EXPORT int dup(int old)
{
	ensure_init();
	if (ours(old)) {
		errno = EBADF;
		return -1;
	}
	int r = real.dup ? real.dup(old) : (int)syscall(SYS_dup, old);
	if (r >= 0) {
		int saved = errno;
		copy_entry(old, r);
		errno = saved;
	}
	return r;
}

static int do_dup3(int old, int new, int flags, int is_dup2)
{
	if (ours(old)) {
		errno = EBADF;
		return -1;
	}
	if (old == new) {
		if (is_dup2)
			return real.dup2 ? real.dup2(old, new) : sys_fcntl(old, F_GETFD, 0) < 0 ? -1 : new;
		errno = EINVAL;
		return -1;
	}
	int moved = ours(new);
	if (moved)
		relocate(new);
	int r = is_dup2 ? (real.dup2 ? real.dup2(old, new) : sys_dup3(old, new, 0)) : sys_dup3(old, new, flags);
	int saved = errno;
	if (r >= 0)
		copy_entry(old, new);
	else if (moved && !ours(new))
		sys_close(new); /* the dup of our socket relocate left behind */
	errno = saved;
	return r;
}

EXPORT int dup2(int old, int new)
{
	ensure_init();
	return do_dup3(old, new, 0, 1);
}

EXPORT int dup3(int old, int new, int flags)
{
	ensure_init();
	return do_dup3(old, new, flags, 0);
}

static int do_fcntl(int (*fn)(int, int, ...), int fd, int cmd, void *arg)
{
	if (ours(fd)) {
		errno = EBADF;
		return -1;
	}
	int r = fn ? fn(fd, cmd, arg) : (int)syscall(SYS_fcntl, fd, cmd, arg);
	if (r >= 0 && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC)) {
		int saved = errno;
		copy_entry(fd, r);
		errno = saved;
	}
	return r;
}

EXPORT int fcntl(int fd, int cmd, ...)
{
	va_list ap;
	va_start(ap, cmd);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	ensure_init();
	return do_fcntl(real.fcntl, fd, cmd, arg);
}

int fcntl64(int fd, int cmd, ...);
EXPORT int fcntl64(int fd, int cmd, ...)
{
	va_list ap;
	va_start(ap, cmd);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	ensure_init();
	return do_fcntl(real.fcntl64 ? real.fcntl64 : real.fcntl, fd, cmd, arg);
}

/* ---- socket options and peers ---- */

EXPORT int setsockopt(int fd, int level, int name, const void *val, socklen_t len)
{
	ensure_init();
	struct vent se;
	if (level == IPPROTO_TCP && name == TCP_DEFER_ACCEPT && !t_busy && entry_copy(fd, ST_SERVED, &se))
		return 0; /* the agent waits for a client's first bytes already; on the private port,
			   * where a plain client's connection never carries any, it would only delay */
	int r = sys_setsockopt(fd, level, name, val, len);
	if (r < 0 || t_busy || val == NULL || len == 0 || len > OPT_MAX)
		return r;
	if (level != SOL_SOCKET && level != IPPROTO_TCP && level != IPPROTO_IP && level != IPPROTO_IPV6)
		return r;
	int saved = errno;
	ino_t ino;
	if (sock_ino(fd, &ino) == 0) {
		lockstate ls;
		lock(&ls);
		struct vent *e = slot(fd, 1);
		if (e && e->state != ST_NONE && e->ino != ino)
			memset(e, 0, sizeof *e);
		if (e && e->state == ST_NONE) {
			e->state = ST_OPTS;
			e->ino = ino;
		}
		if (e && e->state == ST_OPTS) {
			int k = 0;
			while (k < e->nopts && (e->opts[k].level != level || e->opts[k].name != name))
				k++;
			if (k < MAX_OPTS) {
				e->opts[k].level = level;
				e->opts[k].name = name;
				e->opts[k].len = (unsigned char)len;
				memcpy(e->opts[k].val, val, len);
				if (k == e->nopts)
					e->nopts++;
			}
		}
		unlock(&ls);
	}
	errno = saved;
	return r;
}

/* getsockopt: SO_ERROR of a held connect whose dial failed is the dial's
 * errno, not the reset that woke the program. */
EXPORT int getsockopt(int fd, int level, int name, void *val, socklen_t *len)
{
	ensure_init();
	int r = sys_getsockopt(fd, level, name, val, len);
	if (r == 0 && level == SOL_SOCKET && name == SO_ERROR && !t_busy && val && len && *len >= sizeof(int)) {
		int v, saved = errno;
		memcpy(&v, val, sizeof v);
		v = held_error(fd, v);
		memcpy(val, &v, sizeof v);
		errno = saved;
	}
	return r;
}

static void copy_out(const union vsockaddr *a, socklen_t alen, struct sockaddr *sa, socklen_t *len)
{
	memcpy(sa, a, *len < alen ? *len : alen);
	*len = alen;
}

/* redirected_orig returns the address a redirected socket's program asked
 * for, and its length, or 0. */
static socklen_t redirected_orig(int fd, union vsockaddr *orig)
{
	struct vent e;
	if (!entry_copy(fd, ST_REDIRECTED, &e))
		return 0;
	*orig = e.orig;
	return e.origlen;
}

EXPORT int getpeername(int fd, struct sockaddr *sa, socklen_t *len)
{
	int saved = errno;
	ensure_init();
	if (t_busy || sa == NULL || len == NULL)
		return sys_getpeername(fd, sa, len);
	union vsockaddr orig, peer;
	socklen_t origlen = redirected_orig(fd, &orig);
	socklen_t pl = sizeof peer;
	/* Not connected (yet, or any more): the kernel's ENOTCONN. */
	if (sys_getpeername(fd, &peer.sa, &pl) < 0)
		return -1;
	if (origlen > 0) {
		copy_out(&orig, origlen, sa, len);
		errno = saved;
		return 0;
	}
	struct vaddr pv;
	/* A relay connection made before an exec: the table is gone, the
	 * agent still knows. */
	if (g_agent_len > 0 && to_vaddr(&peer.sa, pl, &pv) == 0 && is_loopback(&pv) && pv.port != 0) {
		int was = t_busy;
		t_busy = 1;
		if (welcome_known() && (pv.port == g_w.relay4 || pv.port == g_w.relay6 || pv.port == g_w.held4 ||
					pv.port == g_w.held6)) {
			union vsockaddr la;
			socklen_t ll = sizeof la;
			struct vaddr local;
			int i;
			if (sys_getsockname(fd, &la.sa, &ll) == 0 && to_vaddr(&la.sa, ll, &local) == 0 &&
			    (i = get_chan()) >= 0) {
				unsigned char b[VL_MAXBODY];
				size_t n;
				struct vaddr want;
				put_addr(b, &local);
				int ok = send_frame(i, M_PEER, b, VL_ADDR) == 0 &&
					 recv_frame(i, M_PEERADDR, b, VL_PEERADDR, VL_PEERADDR, &n, NULL, 0) == 0;
				put_chan(i, ok);
				if (ok && b[0] == 1 && get_addr(b + 1, &want) == 0) {
					origlen = from_vaddr(&want, peer.sa.sa_family, &orig);
					mark_redirected(fd, &orig, origlen, HELD_NO, 0);
				}
			}
		}
		t_busy = was;
	}
	if (origlen > 0)
		copy_out(&orig, origlen, sa, len);
	else
		copy_out(&peer, pl, sa, len);
	errno = saved;
	return 0;
}

/* getsockname: a relayed connection's socket is connected to the agent on
 * loopback, and its real local address says so. Without the shim it would
 * be an address on the path to the peer: answer the one the kernel picks
 * for the address the program connected to (a connected UDP socket finds
 * it without sending anything), keeping the socket's own port. With no
 * route there, the real (loopback) address stays. */
EXPORT int getsockname(int fd, struct sockaddr *sa, socklen_t *len)
{
	int saved = errno;
	ensure_init();
	union vsockaddr local;
	socklen_t ll = sizeof local;
	if (sa == NULL || len == NULL || t_busy)
		return sys_getsockname(fd, sa, len);
	if (sys_getsockname(fd, &local.sa, &ll) < 0)
		return -1;
	if (has_entry(fd)) {
		/* A socket listening in the program's place answers the address
		 * the program bound; a VLink client's, the one it connected to. */
		socklen_t kl = 0;
		lockstate ls;
		lock(&ls);
		struct vent *e = valid(fd);
		if (e && e->state == ST_SERVED) {
			local = e->orig;
			kl = e->origlen;
		} else if (e && e->state == ST_REDIRECTED && e->selflen > 0) {
			local = e->self;
			kl = e->selflen;
		}
		unlock(&ls);
		if (kl > 0) {
			copy_out(&local, kl, sa, len);
			errno = saved;
			return 0;
		}
	}
	struct vaddr lv, pv;
	union vsockaddr peer;
	socklen_t pl = 0;
	if (to_vaddr(&local.sa, ll, &lv) == 0 && is_loopback(&lv) && g_agent_len > 0) {
		/* What the program asked for; getpeername also asks the agent
		 * about a relay connection made before an exec. A held connect
		 * has no peer yet, but its entry knows. */
		pl = redirected_orig(fd, &peer);
		if (pl == 0) {
			pl = sizeof peer;
			if (getpeername(fd, &peer.sa, &pl) < 0)
				pl = 0;
		}
	}
	if (pl > 0 && to_vaddr(&peer.sa, pl, &pv) == 0 && !is_loopback(&pv)) {
		int u = socket(local.sa.sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
		if (u >= 0) {
			union vsockaddr path;
			socklen_t pathl = sizeof path;
			struct vaddr route;
			if (sys_connect(u, &peer.sa, pl) == 0 && sys_getsockname(u, &path.sa, &pathl) == 0 &&
			    to_vaddr(&path.sa, pathl, &route) == 0) {
				route.port = lv.port;
				ll = from_vaddr(&route, local.sa.sa_family, &local);
			}
			sys_close(u);
		}
	}
	copy_out(&local, ll, sa, len);
	errno = saved;
	return 0;
}

/* ---- serving: the program's listeners on served ports ---- */

/* served_port reports whether the agent takes VLink clients on port. */
static int served_port(uint16_t port)
{
	if (g_agent_len == 0 || port == 0)
		return 0;
	if (!__atomic_load_n(&g_served.known, __ATOMIC_ACQUIRE)) {
		int was = t_busy;
		t_busy = 1;
		int ok = welcome_known();
		t_busy = was;
		if (!ok || !__atomic_load_n(&g_served.known, __ATOMIC_ACQUIRE))
			return 0;
	}
	for (int k = 0; k < g_served.n; k++)
		if (g_served.port[k] == port)
			return 1;
	return 0;
}

/* bind: a TCP socket bound to a served port is bound to a loopback port
 * instead, its private port; the agent listens on the address the program
 * asked for once the socket listens. */
EXPORT int bind(int fd, const struct sockaddr *sa, socklen_t len)
{
	ensure_init();
	struct vaddr v;
	int stream, saved = errno;
	if (t_busy || sa == NULL || len < sizeof(sa_family_t) || (sa->sa_family != AF_INET && sa->sa_family != AF_INET6) ||
	    to_vaddr(sa, len, &v) < 0 || stream_socket(fd, &stream) < 0 || !stream || !served_port(v.port))
		return sys_bind(fd, sa, len);
	errno = saved;
	union vsockaddr lo;
	socklen_t ll;
	struct vaddr loop = { 4, 0, { 127, 0, 0, 1 } };
	int r;
	if (sa->sa_family == AF_INET6) {
		struct vaddr lo6 = { 6, 0, { 0 } };
		lo6.ip[15] = 1;
		ll = from_vaddr(&lo6, AF_INET6, &lo);
		r = sys_bind(fd, &lo.sa, ll);
		if (r < 0 && errno == EADDRNOTAVAIL) { /* no IPv6 loopback: a dual-stack socket takes IPv4's */
			ll = from_vaddr(&loop, AF_INET6, &lo);
			r = sys_bind(fd, &lo.sa, ll);
		}
	} else {
		ll = from_vaddr(&loop, AF_INET, &lo);
		r = sys_bind(fd, &lo.sa, ll);
	}
	if (r < 0)
		return r;
	struct vent ent;
	memset(&ent, 0, sizeof ent);
	ent.state = ST_SERVED;
	ent.origlen = (unsigned char)(len < sizeof ent.orig ? len : sizeof ent.orig);
	memcpy(&ent.orig, sa, ent.origlen);
	put_entry(fd, &ent);
	debugf("bind fd %d: served port %u, listening in the program's place", fd, v.port);
	errno = saved;
	return 0;
}

/* listen: a served socket's listen makes the agent listen on the address
 * the program bound, and hand it clients through the private port. */
EXPORT int listen(int fd, int backlog)
{
	ensure_init();
	int r = sys_listen(fd, backlog);
	struct vent e;
	if (r < 0 || t_busy || !entry_copy(fd, ST_SERVED, &e))
		return r;
	int saved = errno;
	union vsockaddr pa;
	socklen_t pl = sizeof pa;
	struct vaddr bound, priv;
	if (to_vaddr(&e.orig.sa, e.origlen, &bound) < 0 || sys_getsockname(fd, &pa.sa, &pl) < 0 ||
	    to_vaddr(&pa.sa, pl, &priv) < 0) {
		errno = EINVAL;
		return -1;
	}
	int was = t_busy;
	t_busy = 1;
	int i = get_chan(), err = EADDRNOTAVAIL;
	if (i >= 0) {
		unsigned char b[VL_MAXBODY];
		size_t n;
		put_addr(b, &bound);
		put_addr(b + VL_ADDR, &priv);
		int ok = send_frame(i, M_LISTEN, b, VL_LISTEN) == 0 &&
			 recv_frame(i, M_ERRNO, b, VL_ERRNO, VL_ERRNO, &n, NULL, 0) == 0;
		put_chan(i, ok);
		if (ok)
			err = get16(b);
	} else {
		agent_down(errno);
	}
	t_busy = was;
	if (err != 0) {
		errno = err > 0 && err < 4096 ? err : EADDRNOTAVAIL;
		return -1;
	}
	errno = saved;
	return 0;
}

/* served_accept takes a connection the agent made to a served socket's
 * private port, and makes it the client's: a plain client's own socket
 * replaces it; a VLink client stays relayed, with the client's addresses
 * for getpeername and getsockname. A connection the agent did not make is
 * dropped. */
static int served_accept(int fd, struct sockaddr *sa, socklen_t *len, int flags)
{
	for (;;) {
		union vsockaddr peer;
		socklen_t pl = sizeof peer;
		int r = sys_accept4(fd, &peer.sa, &pl, flags);
		if (r < 0)
			return r;
		int saved = errno;
		struct vaddr from;
		int was = t_busy, kind = -1, nfd = -1;
		unsigned char b[VL_MAXBODY];
		size_t n;
		t_busy = 1;
		int i = to_vaddr(&peer.sa, pl, &from) == 0 ? get_chan() : -1;
		if (i >= 0) {
			put_addr(b, &from);
			int ok = send_frame(i, M_ACCEPTED, b, VL_ADDR) == 0 &&
				 recv_frame(i, M_ACCEPTINFO, b, VL_ACCEPTINFO, VL_ACCEPTINFO, &n, &nfd, 0) == 0;
			put_chan(i, ok);
			if (ok)
				kind = b[0];
		}
		t_busy = was;
		struct vaddr remote, local;
		if (kind == A_PLAIN && nfd >= 0) {
			if (sys_dup3(nfd, r, (flags & SOCK_CLOEXEC) ? O_CLOEXEC : 0) < 0) {
				sys_close(nfd);
				sys_close(r);
				errno = ECONNABORTED;
				return -1;
			}
			sys_close(nfd);
			int fl = sys_fcntl(r, F_GETFL, 0);
			if (fl >= 0)
				sys_fcntl(r, F_SETFL, (flags & SOCK_NONBLOCK) ? fl | O_NONBLOCK : fl & ~O_NONBLOCK);
			forget(r);
			if (sa && len)
				sys_getpeername(r, sa, len);
			debugf("accept on fd %d: a plain client's own socket, fd %d", fd, r);
			errno = saved;
			return r;
		}
		if (nfd >= 0)
			sys_close(nfd);
		if (kind == A_PLAIN)
			kind = -1; /* promised a socket and sent none: an aborted connection */
		if (kind == A_RELAYED && get_addr(b + 1, &remote) == 0 && get_addr(b + 1 + VL_ADDR, &local) == 0) {
			union vsockaddr ra, la;
			socklen_t ral = from_vaddr(&remote, peer.sa.sa_family, &ra);
			socklen_t lal = from_vaddr(&local, peer.sa.sa_family, &la);
			struct vent ent;
			memset(&ent, 0, sizeof ent);
			ent.state = ST_REDIRECTED;
			ent.orig = ra;
			ent.origlen = (unsigned char)ral;
			ent.self = la;
			ent.selflen = (unsigned char)lal;
			put_entry(r, &ent);
			if (sa && len)
				copy_out(&ra, ral, sa, len);
			debugf("accept on fd %d: a VLink client, relayed, fd %d", fd, r);
			errno = saved;
			return r;
		}
		/* Not the agent's (kind A_UNKNOWN), or no answer: a local process
		 * connected to the private port, which must not bypass the
		 * listener's policy. */
		sys_close(r);
		if (kind < 0) {
			errno = ECONNABORTED; /* servers retry it */
			return -1;
		}
		debugf("accept on fd %d: dropped a connection the agent did not make", fd);
	}
}

EXPORT int accept4(int fd, struct sockaddr *sa, socklen_t *len, int flags)
{
	ensure_init();
	struct vent e;
	if (t_busy || !entry_copy(fd, ST_SERVED, &e))
		return sys_accept4(fd, sa, len, flags);
	return served_accept(fd, sa, len, flags);
}

EXPORT int accept(int fd, struct sockaddr *sa, socklen_t *len)
{
	return accept4(fd, sa, len, 0);
}

/* ---- datagrams ---- */

/* no_datagrams fails a datagram to a stand-in address (a name the far
 * side resolves) that is not carried, with ENETUNREACH, and says why on
 * stderr, once per process: the program alone would not say more than
 * "Network is unreachable". vlink exec carries UDP (route_datagram,
 * relay_dest), not other datagram protocols (UDP-Lite, ICMP, raw). */
static int no_datagrams(void)
{
	static int noted;
	if (!__atomic_exchange_n(&noted, 1, __ATOMIC_RELAXED))
		note("a datagram to a name the far side resolves is carried only on a UDP socket, not this one's "
		     "protocol; the program gets ENETUNREACH");
	errno = ENETUNREACH;
	return -1;
}

/* fastopen connects a TCP Fast Open send (MSG_FASTOPEN with an address)
 * through the shim when its route is not known to be direct: a routed
 * connection cannot carry data in its SYN. It returns 1 if it handled the
 * call, with *r set. */
static int fastopen(int fd, const void *buf, size_t n, int flags, const struct sockaddr *sa, socklen_t len,
		    ssize_t *r)
{
	struct vaddr v;
	int stream;
	if (!(flags & MSG_FASTOPEN) || !sa || len < sizeof(sa_family_t) ||
	    (sa->sa_family != AF_INET && sa->sa_family != AF_INET6) || to_vaddr(sa, len, &v) < 0 ||
	    stream_socket(fd, &stream) < 0 || !stream || quick_direct(&v))
		return 0;
	if (connect(fd, sa, len) < 0) {
		*r = -1; /* EINPROGRESS for a non-blocking socket: nothing sent, as the kernel says without a cookie */
		return 1;
	}
	*r = send(fd, buf, n, flags & ~MSG_FASTOPEN);
	return 1;
}

/* relayed_entry copies fd's entry if fd is a UDP socket whose datagrams
 * the agent relays. */
static int relayed_entry(int fd, struct vent *e)
{
	return entry_state(fd) == ST_REDIRECTED && entry_copy(fd, ST_REDIRECTED, e) && e->dgram;
}

/* to_relayed reports whether sa is the address a relayed UDP socket's
 * program connected to: a datagram sent there goes to the socket's peer,
 * the relay. */
static int to_relayed(int fd, const struct sockaddr *sa, socklen_t len)
{
	struct vent e;
	struct vaddr a, b;
	return sa && len >= sizeof(sa_family_t) && relayed_entry(fd, &e) && to_vaddr(sa, len, &a) == 0 &&
	       to_vaddr(&e.orig.sa, e.origlen, &b) == 0 && memcmp(&a, &b, sizeof a) == 0;
}

/* relayed_from shows a relayed UDP socket's program the address it
 * connected to as the source of what the relay sends it, in recvfrom's
 * and recvmsg's address (sa, of cap bytes, the length in *len). */
static void relayed_from(int fd, struct sockaddr *sa, socklen_t cap, socklen_t *len)
{
	struct vent e;
	struct vaddr from;
	struct udpmap m;
	int st = entry_state(fd);
	if (sa == NULL || len == NULL || *len == 0 || (st != ST_REDIRECTED && st != ST_UDPMAP) ||
	    to_vaddr(sa, *len < cap ? *len : cap, &from) < 0 || !is_loopback(&from))
		return;
	if (st == ST_UDPMAP) {
		if (sock_ino(fd, &m.ino) == 0 && umap_find(m.ino, NULL, from.port, &m)) {
			*len = cap;
			copy_out(&m.orig, m.origlen, sa, len);
		}
		return;
	}
	if (entry_any(fd, &e) && e.state == ST_REDIRECTED && e.dgram && from.port == e.token) {
		*len = cap;
		copy_out(&e.orig, e.origlen, sa, len);
	}
}

EXPORT ssize_t recvfrom(int fd, void *buf, size_t n, int flags, struct sockaddr *sa, socklen_t *len)
{
	ensure_init();
	socklen_t cap = len ? *len : 0;
	ssize_t r = real.recvfrom ? real.recvfrom(fd, buf, n, flags, sa, len)
				  : syscall(SYS_recvfrom, fd, buf, n, flags, sa, len);
	if (r >= 0 && !t_busy) {
		int saved = errno;
		relayed_from(fd, sa, cap, len);
		errno = saved;
	}
	return r;
}

/* _FORTIFY_SOURCE's recvfrom, when the buffer's size is known. */
EXPORT ssize_t __recvfrom_chk(int fd, void *buf, size_t n, size_t buflen, int flags, struct sockaddr *sa,
			      socklen_t *len)
{
	ensure_init();
	if (!real.recvfrom_chk)
		abort(); /* only glibc calls it, and glibc has it */
	socklen_t cap = len ? *len : 0;
	ssize_t r = real.recvfrom_chk(fd, buf, n, buflen, flags, sa, len);
	if (r >= 0 && !t_busy) {
		int saved = errno;
		relayed_from(fd, sa, cap, len);
		errno = saved;
	}
	return r;
}

EXPORT ssize_t recvmsg(int fd, struct msghdr *m, int flags)
{
	ensure_init();
	socklen_t cap = m ? m->msg_namelen : 0;
	ssize_t r = real.recvmsg ? real.recvmsg(fd, m, flags) : syscall(SYS_recvmsg, fd, m, flags);
	if (r >= 0 && !t_busy) {
		int saved = errno;
		relayed_from(fd, m->msg_name, cap, &m->msg_namelen);
		errno = saved;
	}
	return r;
}

EXPORT int recvmmsg(int fd, struct mmsghdr *v, unsigned int n, int flags, struct timespec *timeout)
{
	ensure_init();
	if (t_busy || v == NULL || !has_entry(fd))
		return real.recvmmsg ? real.recvmmsg(fd, v, n, flags, timeout)
				     : (int)syscall(SYS_recvmmsg, fd, v, n, flags, timeout);
	socklen_t caps[UIO_MAXIOV];
	if (n > UIO_MAXIOV)
		n = UIO_MAXIOV; /* the kernel takes no more */
	for (unsigned int k = 0; k < n; k++)
		caps[k] = v[k].msg_hdr.msg_namelen;
	int r = real.recvmmsg ? real.recvmmsg(fd, v, n, flags, timeout)
			      : (int)syscall(SYS_recvmmsg, fd, v, n, flags, timeout);
	int saved = errno;
	for (int k = 0; k < r; k++)
		relayed_from(fd, v[k].msg_hdr.msg_name, caps[k], &v[k].msg_hdr.msg_namelen);
	errno = saved;
	return r;
}

/* dgram_dest decides where a datagram that fd sends to sa (not NULL)
 * goes: 0 as written; 1 to the address in *ra, *rl, or to the socket's
 * peer (its relay) if *rl is 0; -1 nowhere, with errno. */
static int dgram_dest(int fd, const struct sockaddr *sa, socklen_t len, union vsockaddr *ra, socklen_t *rl)
{
	if (to_relayed(fd, sa, len)) {
		*rl = 0;
		return 1;
	}
	return relay_dest(fd, sa, len, ra, rl);
}

/* needs_relay reports whether a datagram fd sends to sa may not go as
 * written (dgram_dest decides), without asking the agent. */
static int needs_relay(int fd, const struct sockaddr *sa, socklen_t len)
{
	struct vaddr dst;
	int err;
	if (sa == NULL || len < sizeof(sa_family_t) || (sa->sa_family != AF_INET && sa->sa_family != AF_INET6) ||
	    to_vaddr(sa, len, &dst) < 0)
		return 0;
	return is_fake(&dst) || known_verdict(&dst, &err) != R_DIRECT || to_relayed(fd, sa, len);
}

/* urgent says, once per process, that an urgent byte (MSG_OOB) on a
 * connection vlink carries does not reach the far side: each relay reads
 * its socket's stream, from which TCP takes the urgent byte out, and
 * vlink's stacks have nothing to carry it as. Carrying it in the stream
 * instead would hand the far program a byte it never sees without vlink
 * (unless it asked for SO_OOBINLINE); the send itself succeeds, as
 * without vlink. */
static void urgent(int fd, int flags)
{
	static int noted;
	if (!(flags & MSG_OOB) || t_busy || entry_state(fd) != ST_REDIRECTED ||
	    __atomic_load_n(&noted, __ATOMIC_RELAXED))
		return;
	struct vent e;
	if (entry_copy(fd, ST_REDIRECTED, &e) && !e.dgram && !__atomic_exchange_n(&noted, 1, __ATOMIC_RELAXED))
		note("an urgent byte (MSG_OOB) does not cross vlink: the far side does not get it");
}

EXPORT ssize_t send(int fd, const void *buf, size_t n, int flags)
{
	ensure_init();
	urgent(fd, flags);
	return real.send ? real.send(fd, buf, n, flags) : syscall(SYS_sendto, fd, buf, n, flags, NULL, 0);
}

EXPORT ssize_t sendto(int fd, const void *buf, size_t n, int flags, const struct sockaddr *sa, socklen_t len)
{
	ensure_init();
	urgent(fd, flags);
	if (!t_busy && sa) {
		ssize_t r;
		if (fastopen(fd, buf, n, flags, sa, len, &r))
			return r;
		union vsockaddr ra;
		socklen_t rl;
		if (!(flags & MSG_FASTOPEN)) {
			switch (dgram_dest(fd, sa, len, &ra, &rl)) {
			case -1:
				return -1;
			case 1:
				sa = rl ? &ra.sa : NULL;
				len = rl;
			}
		}
	}
	return real.sendto ? real.sendto(fd, buf, n, flags, sa, len)
			   : syscall(SYS_sendto, fd, buf, n, flags, sa, len);
}

EXPORT ssize_t sendmsg(int fd, const struct msghdr *m, int flags)
{
	ensure_init();
	struct msghdr relayed;
	union vsockaddr ra;
	socklen_t rl;
	urgent(fd, flags);
	if (!t_busy && m && m->msg_name) {
		const struct sockaddr *sa = m->msg_name;
		if ((flags & MSG_FASTOPEN) && m->msg_iovlen == 1) {
			ssize_t r;
			if (fastopen(fd, m->msg_iov[0].iov_base, m->msg_iov[0].iov_len, flags, sa, m->msg_namelen, &r))
				return r;
		}
		if (!(flags & MSG_FASTOPEN)) {
			switch (dgram_dest(fd, sa, m->msg_namelen, &ra, &rl)) {
			case -1:
				return -1;
			case 1:
				relayed = *m;
				relayed.msg_name = rl ? &ra : NULL;
				relayed.msg_namelen = rl;
				m = &relayed;
			}
		}
	}
	return real.sendmsg ? real.sendmsg(fd, m, flags) : syscall(SYS_sendmsg, fd, m, flags);
}

EXPORT int sendmmsg(int fd, struct mmsghdr *v, unsigned int n, int flags)
{
	ensure_init();
	int plain = 1;
	for (unsigned int k = 0; !t_busy && v && k < n && plain; k++)
		plain = !needs_relay(fd, v[k].msg_hdr.msg_name, v[k].msg_hdr.msg_namelen);
	if (plain)
		return real.sendmmsg ? real.sendmmsg(fd, v, n, flags) : (int)syscall(SYS_sendmmsg, fd, v, n, flags);
	/* A datagram goes elsewhere than written: one at a time, through
	 * sendmsg, which decides for each. */
	if (n > UIO_MAXIOV)
		n = UIO_MAXIOV; /* the kernel sends no more */
	for (unsigned int k = 0; k < n; k++) {
		ssize_t r = sendmsg(fd, &v[k].msg_hdr, flags);
		if (r < 0)
			return k > 0 ? (int)k : -1;
		v[k].msg_len = (unsigned int)r;
	}
	return (int)n;
}

/* ---- names ---- */

/* resolvable reports whether a name is one the agent decides about: not
 * empty, not an IP literal in any form getaddrinfo accepts. */
static int resolvable(const char *name)
{
	struct in_addr a4;
	if (name == NULL || name[0] == '\0' || strchr(name, ':') != NULL || inet_aton(name, &a4))
		return 0;
	return strnlen(name, VL_MAXNAME + 2) <= VL_MAXNAME + 1;
}

struct namereply {
	int kind;
	unsigned char v4[4], v6[16];
};

/* ask_name asks the agent how to resolve name: N_LOCAL, N_FAKE or
 * N_NONE, or -1 if the agent cannot be asked. */
static int ask_name(const char *name, uint16_t port, struct namereply *nr)
{
	size_t nl = strlen(name);
	int i = get_chan();
	if (i < 0) {
		agent_down(errno);
		return -1;
	}
	unsigned char b[VL_MAXBODY];
	size_t n;
	put16(b, port);
	memcpy(b + 2, name, nl);
	if (send_frame(i, M_RESOLVE, b, 2 + nl) < 0 || recv_frame(i, M_NAME, b, VL_NAME, VL_NAME, &n, NULL, 0) < 0) {
		int e = errno;
		put_chan(i, 0);
		agent_down(e);
		return -1;
	}
	put_chan(i, 1);
	nr->kind = b[0];
	memcpy(nr->v4, b + 1, 4);
	memcpy(nr->v6, b + 5, 16);
	if (nr->kind < N_LOCAL || nr->kind > N_NONE) {
		note("agent sent an unknown name kind %d", nr->kind);
		return -1;
	}
	debugf("resolve %s: %s", name, nr->kind == N_LOCAL ? "local" : nr->kind == N_FAKE ? "far side" : "no such name");
	return nr->kind;
}

/* has_fam: the agent hands out no stand-in (all zeros) for a family the
 * far side says the name lacks. */
static int has_fam(const struct namereply *nr, int af)
{
	const unsigned char *a = af == AF_INET6 ? nr->v6 : nr->v4;
	size_t n = af == AF_INET6 ? 16 : 4;
	for (size_t k = 0; k < n; k++)
		if (a[k])
			return 1;
	return 0;
}

#ifdef EAI_NODATA
#define VL_EAI_NODATA EAI_NODATA
#else
#define VL_EAI_NODATA EAI_NONAME
#endif

static uint16_t service_port(const char *service)
{
	if (service == NULL)
		return 0;
	char *end;
	long p = strtol(service, &end, 10);
	if (end == service || *end != '\0' || p < 0 || p > 65535)
		return 0;
	return (uint16_t)p;
}

EXPORT int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints, struct addrinfo **res)
{
	ensure_init();
	if (!real.getaddrinfo)
		return EAI_SYSTEM;
	int fam = hints ? hints->ai_family : AF_UNSPEC;
	if (t_busy || !resolvable(node) || (hints && (hints->ai_flags & AI_NUMERICHOST)) ||
	    (fam != AF_UNSPEC && fam != AF_INET && fam != AF_INET6))
		return real.getaddrinfo(node, service, hints, res);
	int saved = errno;
	struct namereply nr;
	int was = t_busy;
	t_busy = 1;
	int kind = ask_name(node, service_port(service), &nr);
	t_busy = was;
	errno = saved;
	switch (kind) {
	case N_LOCAL:
		return real.getaddrinfo(node, service, hints, res);
	case N_NONE:
		return EAI_NONAME;
	case N_FAKE:
		break;
	default:
		return EAI_AGAIN; /* fail closed: no DNS query for a name we cannot place */
	}
	/* The fake addresses as literals, through the real getaddrinfo, which
	 * builds the list exactly as for any address: socket types, ports,
	 * service names, flags. AF_UNSPEC gets both, IPv4 first: programs
	 * asked for one family (curl -6) often resolve both and pick. */
	struct addrinfo h;
	memset(&h, 0, sizeof h);
	if (hints)
		h = *hints;
	else
		h.ai_flags = AI_V4MAPPED | AI_ADDRCONFIG;
	/* The agent reaches them whatever the local interfaces are. */
	h.ai_flags = (h.ai_flags & ~AI_ADDRCONFIG) | AI_NUMERICHOST;
	struct addrinfo *lists[2] = { NULL, NULL };
	int r = EAI_NONAME, n = 0;
	for (int k = 0; k < 2; k++) {
		int f = k == 0 ? AF_INET : AF_INET6;
		if (fam != AF_UNSPEC && fam != f)
			continue;
		char lit[INET6_ADDRSTRLEN + 8];
		if (has_fam(&nr, f)) {
			inet_ntop(f, f == AF_INET6 ? (void *)nr.v6 : (void *)nr.v4, lit, sizeof lit);
		} else if (f == AF_INET6 && fam == AF_INET6 && (h.ai_flags & AI_V4MAPPED) && has_fam(&nr, AF_INET)) {
			/* Only IPv4 on the far side: mapped, as the resolver would. */
			char v4[INET_ADDRSTRLEN];
			inet_ntop(AF_INET, nr.v4, v4, sizeof v4);
			snprintf(lit, sizeof lit, "::ffff:%s", v4);
		} else {
			r = VL_EAI_NODATA; /* the name exists, without this family */
			continue;
		}
		h.ai_family = f;
		int e = real.getaddrinfo(lit, service, &h, &lists[n]);
		if (e == 0)
			n++;
		else if (r != 0)
			r = e;
	}
	if (n == 0) {
		errno = saved;
		return r;
	}
	if (n == 2) {
		/* glibc frees a list node by node, so two lists join into one. */
		if (lists[1]->ai_canonname) {
			free(lists[1]->ai_canonname);
			lists[1]->ai_canonname = NULL;
		}
		struct addrinfo *t = lists[0];
		while (t->ai_next)
			t = t->ai_next;
		t->ai_next = lists[1];
	}
	*res = lists[0];
	if ((h.ai_flags & AI_CANONNAME) && (*res)->ai_canonname) {
		char *c = strdup(node);
		if (c) {
			free((*res)->ai_canonname);
			(*res)->ai_canonname = c;
		}
	}
	errno = saved;
	return 0;
}

/* hostent_fill lays out a hostent for name with one address in buf. */
static int hostent_fill(struct hostent *h, char *buf, size_t buflen, const char *name, int af,
			const struct namereply *nr)
{
	size_t alen = af == AF_INET6 ? 16 : 4, nl = strlen(name) + 1;
	uintptr_t p = ((uintptr_t)buf + sizeof(char *) - 1) & ~(uintptr_t)(sizeof(char *) - 1);
	size_t need = (size_t)(p - (uintptr_t)buf) + 3 * sizeof(char *) + 16 + nl;
	if (buflen < need)
		return ERANGE;
	char **addrs = (char **)p, **aliases = addrs + 2;
	char *addr = (char *)(aliases + 1), *hname = addr + 16;
	memcpy(addr, af == AF_INET6 ? (const void *)nr->v6 : (const void *)nr->v4, alen);
	memcpy(hname, name, nl);
	addrs[0] = addr;
	addrs[1] = NULL;
	aliases[0] = NULL;
	h->h_name = hname;
	h->h_aliases = aliases;
	h->h_addrtype = af;
	h->h_length = (int)alen;
	h->h_addr_list = addrs;
	return 0;
}

static TLS struct {
	struct hostent h;
	char buf[3 * sizeof(char *) + 16 + VL_MAXNAME + 2 + sizeof(char *)];
} t_host;

/* host_kind asks about a gethostbyname* name: N_LOCAL, N_FAKE, N_NONE or -1. */
static int host_kind(const char *name, int af, struct namereply *nr)
{
	if (t_busy || !resolvable(name) || (af != AF_INET && af != AF_INET6))
		return N_LOCAL;
	int saved = errno, was = t_busy;
	t_busy = 1;
	int k = ask_name(name, 0, nr);
	t_busy = was;
	errno = saved;
	if (k == N_FAKE && !has_fam(nr, af))
		return K_NODATA;
	return k;
}

EXPORT struct hostent *gethostbyname2(const char *name, int af)
{
	ensure_init();
	struct namereply nr;
	switch (host_kind(name, af, &nr)) {
	case N_LOCAL:
		if (real.gethostbyname2)
			return real.gethostbyname2(name, af);
		h_errno = NO_RECOVERY;
		return NULL;
	case N_NONE:
		h_errno = HOST_NOT_FOUND;
		return NULL;
	case K_NODATA:
		h_errno = NO_DATA;
		return NULL;
	case N_FAKE:
		if (hostent_fill(&t_host.h, t_host.buf, sizeof t_host.buf, name, af, &nr) == 0)
			return &t_host.h;
		h_errno = NO_RECOVERY;
		return NULL;
	}
	h_errno = TRY_AGAIN;
	return NULL;
}

EXPORT struct hostent *gethostbyname(const char *name)
{
	ensure_init();
	struct namereply nr;
	int k = host_kind(name, AF_INET, &nr);
	if (k == N_LOCAL) {
		if (real.gethostbyname)
			return real.gethostbyname(name);
		h_errno = NO_RECOVERY;
		return NULL;
	}
	if (k == N_FAKE && hostent_fill(&t_host.h, t_host.buf, sizeof t_host.buf, name, AF_INET, &nr) == 0)
		return &t_host.h;
	h_errno = k == N_NONE ? HOST_NOT_FOUND : k == K_NODATA ? NO_DATA : k == N_FAKE ? NO_RECOVERY : TRY_AGAIN;
	return NULL;
}

static int host_r(const char *name, int af, struct hostent *ret, char *buf, size_t buflen, struct hostent **result,
		  int *h_errnop, const struct namereply *nr, int kind)
{
	*result = NULL;
	switch (kind) {
	case N_NONE:
		*h_errnop = HOST_NOT_FOUND;
		return 0;
	case K_NODATA:
		*h_errnop = NO_DATA;
		return 0;
	case N_FAKE: {
		int e = hostent_fill(ret, buf, buflen, name, af, nr);
		if (e) {
			*h_errnop = NETDB_INTERNAL;
			errno = e;
			return e;
		}
		*result = ret;
		*h_errnop = 0;
		return 0;
	}
	}
	*h_errnop = TRY_AGAIN;
	return EAGAIN;
}

EXPORT int gethostbyname2_r(const char *name, int af, struct hostent *ret, char *buf, size_t buflen,
			    struct hostent **result, int *h_errnop)
{
	ensure_init();
	struct namereply nr;
	int k = host_kind(name, af, &nr);
	if (k == N_LOCAL) {
		if (real.gethostbyname2_r)
			return real.gethostbyname2_r(name, af, ret, buf, buflen, result, h_errnop);
		*result = NULL;
		*h_errnop = NO_RECOVERY;
		return ENOSYS;
	}
	return host_r(name, af, ret, buf, buflen, result, h_errnop, &nr, k);
}

EXPORT int gethostbyname_r(const char *name, struct hostent *ret, char *buf, size_t buflen,
			   struct hostent **result, int *h_errnop)
{
	ensure_init();
	struct namereply nr;
	int k = host_kind(name, AF_INET, &nr);
	if (k == N_LOCAL) {
		if (real.gethostbyname_r)
			return real.gethostbyname_r(name, ret, buf, buflen, result, h_errnop);
		*result = NULL;
		*h_errnop = NO_RECOVERY;
		return ENOSYS;
	}
	return host_r(name, AF_INET, ret, buf, buflen, result, h_errnop, &nr, k);
}

EXPORT int getnameinfo(const struct sockaddr *sa, socklen_t salen, char *host, socklen_t hostlen, char *serv,
		       socklen_t servlen, int flags)
{
	ensure_init();
	if (!real.getnameinfo)
		return EAI_SYSTEM;
	struct vaddr v;
	if (t_busy || !host || hostlen == 0 || (flags & NI_NUMERICHOST) || !sa ||
	    (sa->sa_family != AF_INET && sa->sa_family != AF_INET6) || to_vaddr(sa, salen, &v) < 0 || !is_fake(&v))
		return real.getnameinfo(sa, salen, host, hostlen, serv, servlen, flags);
	int saved = errno, was = t_busy;
	t_busy = 1;
	int i = get_chan();
	unsigned char b[VL_MAXBODY];
	size_t n = 0;
	int ok = 0;
	if (i >= 0) {
		put_addr(b, &v);
		ok = send_frame(i, M_ADDRNAME, b, VL_ADDR) == 0 &&
		     recv_frame(i, M_NAMEOF, b, 1, 1 + VL_MAXNAME, &n, NULL, 0) == 0;
		put_chan(i, ok);
	}
	t_busy = was;
	errno = saved;
	if (!ok || b[0] != 1 || n < 2)
		return real.getnameinfo(sa, salen, host, hostlen, serv, servlen, flags);
	if (n - 1 >= hostlen)
		return EAI_OVERFLOW;
	memcpy(host, b + 1, n - 1);
	host[n - 1] = '\0';
	if (serv && servlen > 0)
		return real.getnameinfo(sa, salen, NULL, 0, serv, servlen, flags);
	return 0;
}

/* ---- start-up ---- */

static void *sym(const char *name)
{
	return dlsym(RTLD_NEXT, name);
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

static void init(void)
{
	int saved = errno;
	real.connect = sym("connect");
	real.close = sym("close");
	real.close_range = sym("close_range");
	real.dup = sym("dup");
	real.dup2 = sym("dup2");
	real.dup3 = sym("dup3");
	real.fcntl = sym("fcntl");
	real.fcntl64 = sym("fcntl64");
	real.getpeername = sym("getpeername");
	real.getsockname = sym("getsockname");
	real.getsockopt = sym("getsockopt");
	real.setsockopt = sym("setsockopt");
	real.bind = sym("bind");
	real.listen = sym("listen");
	real.accept4 = sym("accept4");
	real.getaddrinfo = sym("getaddrinfo");
	real.gethostbyname = sym("gethostbyname");
	real.gethostbyname2 = sym("gethostbyname2");
	real.gethostbyname_r = sym("gethostbyname_r");
	real.gethostbyname2_r = sym("gethostbyname2_r");
	real.getnameinfo = sym("getnameinfo");
	real.send = sym("send");
	real.sendto = sym("sendto");
	real.sendmsg = sym("sendmsg");
	real.sendmmsg = sym("sendmmsg");
	real.recvfrom = sym("recvfrom");
	real.recvfrom_chk = sym("__recvfrom_chk");
	real.recvmsg = sym("recvmsg");
	real.recvmmsg = sym("recvmmsg");

	for (int i = 0; i < MAX_CH; i++)
		g_ch[i].fd = -1;
	g_pid = getpid();
	const char *agent = getenv("VLINK_AGENT");
	size_t al = agent ? strlen(agent) : 0;
	if (al >= 2 && agent[0] == '@' && al <= sizeof g_agent.sun_path) {
		g_agent.sun_family = AF_UNIX;
		g_agent.sun_path[0] = '\0'; /* abstract: no file to clean up */
		memcpy(g_agent.sun_path + 1, agent + 1, al - 1);
		g_agent_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + al);
	} else if (al > 0 && al < sizeof g_agent.sun_path) {
		g_agent.sun_family = AF_UNIX;
		memcpy(g_agent.sun_path, agent, al);
		g_agent_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + al + 1);
	}
	const char *tok = getenv("VLINK_AGENT_TOKEN");
	if (tok && strlen(tok) == 2 * VL_TOKEN) {
		for (int k = 0; k < VL_TOKEN; k++) {
			int hi = hexval(tok[2 * k]), lo = hexval(tok[2 * k + 1]);
			if (hi < 0 || lo < 0) {
				memset(g_token, 0, sizeof g_token);
				break;
			}
			g_token[k] = (unsigned char)(hi << 4 | lo);
		}
	}
	const char *d = getenv("VLINK_PRELOAD_DEBUG");
	g_debug = d && d[0] && strcmp(d, "0") != 0;
	const char *c = getenv("VLINK_PRELOAD_CACHE");
	g_nocache = c && strcmp(c, "0") == 0;
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
		rlim_t cur = rl.rlim_cur;
		g_fdbase = cur == RLIM_INFINITY || cur > 1100 ? 1000 : cur > 64 ? (int)(cur * 3 / 4) : 3;
	}
	pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
	errno = saved;
}

__attribute__((constructor)) static void vlink_preload_init(void)
{
	ensure_init();
}
