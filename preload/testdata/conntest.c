/*
 * conntest: socket semantics a program relies on, checked the same way with
 * and without the preload shim. Each test prints "ok ..." lines and exits 0,
 * or prints "FAIL ..." and exits 1. The Go tests (agent_linux_test.go) run it
 * under the shim against direct, relayed and descriptor-passed routes.
 *
 *   conntest nonblock HOST PORT        non-blocking connect, epoll, SO_ERROR,
 *                                      second connect, getpeername, echo
 *   conntest errno HOST PORT           blocking connect: prints errno=NAME
 *   conntest nberrno HOST PORT         non-blocking: prints what SO_ERROR and
 *                                      the first read say
 *   conntest nbconnect HOST PORT       non-blocking: once the socket wakes,
 *                                      prints what a second connect says
 *   conntest nbwait HOST PORT MS       non-blocking: prints whether the
 *                                      socket woke within MS ms, then (after
 *                                      10 s at most) SO_ERROR and getpeername
 *   conntest threads HOST PORT N       N threads connect at once and echo
 *   conntest fork HOST PORT SELF       connect in parent, child, exec'd child
 *   conntest closeall HOST PORT        close every descriptor, dup2 over all,
 *                                      then connect again
 *   conntest sockopt HOST PORT         options set before connect survive it
 *   conntest names HOST                getaddrinfo, gethostbyname*, getnameinfo
 *   conntest udp HOST PORT             a datagram to HOST, then a connect of
 *                                      a UDP and of a UDP-Lite socket
 *   conntest udpecho 4|6 HOST PORT     datagrams to a UDP echo server on a
 *                                      connected socket of that family: send,
 *                                      sendto, sendmsg, sendmmsg, recvfrom,
 *                                      recvmsg, recvmmsg, a datagram of
 *                                      60000 bytes, each echo's bytes and
 *                                      source address checked; prints
 *                                      "ok udp echo" at the end
 *   conntest udpsendto 4|6 HOST PORT  the same on one unconnected socket, to
 *                                      HOST and to 127.0.0.1 in turn (sendto,
 *                                      sendmsg, sendmmsg to both at once):
 *                                      prints "ok udp sendto" at the end
 *   conntest sndtimeo HOST PORT MS     a blocking connect with SO_SNDTIMEO of
 *                                      MS: prints "connect=ERRNO after the
 *                                      timeout" (or "less than"), then, if
 *                                      EINPROGRESS, "later=ERRNO" once
 *                                      writable, and "ok echo" once echoed
 *   conntest oob HOST PORT             an urgent byte (send MSG_OOB), then an
 *                                      echo; prints "oob=sent" and the echo
 *   conntest udprefused HOST PORT      datagrams on a connected UDP socket to
 *                                      a port where nothing listens: prints
 *                                      "refused after N sends" once a send or
 *                                      a receive fails with ECONNREFUSED
 *   conntest afmismatch IP PORT        an IPv4 address on an IPv6 socket
 *   conntest daemon UID HOST PORT      as a daemon: connect, then fork a worker
 *                                      that clears its environment, becomes
 *                                      UID and connects
 *   conntest connbench HOST PORT N [nb]
 *                                      N connects, one after the other, each
 *                                      echoing a byte: prints the median and
 *                                      90th percentile of the connect and of
 *                                      the connect with the echo, in µs; with
 *                                      nb, non-blocking connects, done once
 *                                      writable with SO_ERROR 0
 *   conntest execpeer HOST PORT SELF   getpeername after exec
 *   conntest server 4|6 PORT N         listen on PORT (0.0.0.0 or ::), print
 *                                      "listening private=P" (the kernel's
 *                                      port), then accept N clients under
 *                                      epoll with accept4 (non-blocking,
 *                                      close-on-exec), printing for each
 *                                      "client peer=A kernel_peer=K local=L
 *                                      nonblock=1 cloexec=1" and echoing it
 *   conntest steps HOST PORT           a blocking connect per line read
 *                                      from stdin ("opt": with TCP_KEEPIDLE
 *                                      77 set first; "nb": non-blocking,
 *                                      waited for in poll, its SO_ERROR as
 *                                      its errno; "intr": a first one cut
 *                                      by a signal after 300 ms, printing
 *                                      "errno=NAME then ", and again on the
 *                                      same socket), printing "errno=NAME"
 *                                      and, once connected, "peer=ok" if
 *                                      getpeername says HOST, "keepidle=N",
 *                                      "echo=ok", on one line per connect
 *   conntest peerof FD                 (helper of execpeer)
 *   conntest echo HOST PORT            (helper of fork)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <grp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int failed;

#define FAIL(...)                                   \
	do {                                        \
		printf("FAIL %s:%d: ", __func__, __LINE__); \
		printf(__VA_ARGS__);                \
		printf("\n");                       \
		fflush(stdout);                     \
		failed = 1;                         \
	} while (0)

static const char *ename(int e)
{
	switch (e) {
	case 0: return "0";
	case EINPROGRESS: return "EINPROGRESS";
	case EALREADY: return "EALREADY";
	case EISCONN: return "EISCONN";
	case ECONNREFUSED: return "ECONNREFUSED";
	case ECONNRESET: return "ECONNRESET";
	case ETIMEDOUT: return "ETIMEDOUT";
	case EHOSTUNREACH: return "EHOSTUNREACH";
	case ENETUNREACH: return "ENETUNREACH";
	case EPERM: return "EPERM";
	case EACCES: return "EACCES";
	case EPIPE: return "EPIPE";
	case ENOTCONN: return "ENOTCONN";
	case EBADF: return "EBADF";
	case EINTR: return "EINTR";
	case EAFNOSUPPORT: return "EAFNOSUPPORT";
	case EINVAL: return "EINVAL";
	}
	static char buf[32];
	snprintf(buf, sizeof buf, "errno%d", e);
	return buf;
}

static struct addrinfo *resolve(const char *host, const char *port, int family)
{
	struct addrinfo hints, *res = NULL;
	memset(&hints, 0, sizeof hints);
	hints.ai_family = family;
	hints.ai_socktype = SOCK_STREAM;
	int r = getaddrinfo(host, port, &hints, &res);
	if (r != 0) {
		FAIL("getaddrinfo(%s, %s): %s", host, port, gai_strerror(r));
		return NULL;
	}
	return res;
}

static int same_addr(const struct sockaddr *a, socklen_t al, const struct sockaddr *b, socklen_t bl)
{
	return al == bl && memcmp(a, b, al) == 0;
}

/* echo writes msg, half-closes, and reads everything back. */
static int echo(int fd, const char *msg)
{
	size_t n = strlen(msg);
	if (write(fd, msg, n) != (ssize_t)n) {
		FAIL("write: %s", strerror(errno));
		return -1;
	}
	shutdown(fd, SHUT_WR);
	char buf[4096];
	size_t got = 0;
	for (;;) {
		ssize_t r = read(fd, buf + got, sizeof buf - 1 - got);
		if (r < 0 && errno == EAGAIN) {
			struct pollfd p = { fd, POLLIN, 0 };
			poll(&p, 1, 10000);
			continue;
		}
		if (r < 0) {
			FAIL("read: %s", ename(errno));
			return -1;
		}
		if (r == 0)
			break;
		got += (size_t)r;
	}
	buf[got] = 0;
	if (got != n || memcmp(buf, msg, n) != 0) {
		FAIL("echo: sent %zu bytes %.40s, got %zu bytes %.40s", n, msg, got, buf);
		return -1;
	}
	return 0;
}

static int connect_blocking(const char *host, const char *port, int family)
{
	struct addrinfo *ai = resolve(host, port, family);
	if (!ai)
		return -1;
	int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
		FAIL("connect %s:%s: %s", host, port, ename(errno));
		close(fd);
		fd = -1;
	}
	freeaddrinfo(ai);
	return fd;
}

static int t_nonblock(const char *host, const char *port)
{
	struct addrinfo *ai = resolve(host, port, AF_UNSPEC);
	if (!ai)
		return 1;
	int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	errno = 12345;
	int r = connect(fd, ai->ai_addr, ai->ai_addrlen);
	int e = errno;
	if (r == 0 && e != 12345)
		FAIL("connect succeeded but changed errno to %d", e);
	if (r < 0 && e != EINPROGRESS)
		FAIL("first connect: %s, want EINPROGRESS", ename(e));
	printf("ok first connect: %s\n", r == 0 ? "0" : ename(e));
	if (r < 0) {
		int r2 = connect(fd, ai->ai_addr, ai->ai_addrlen);
		int e2 = errno;
		/* Still in progress: EALREADY; done meanwhile: 0 (then EISCONN). */
		if (!(r2 < 0 && e2 == EALREADY) && r2 != 0)
			FAIL("second connect while in progress: %s", ename(e2));
		else
			printf("ok second connect: %s\n", r2 == 0 ? "0" : ename(e2));
	}
	int ep = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ev = { .events = EPOLLOUT, .data.fd = fd };
	epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
	struct epoll_event got;
	int n = epoll_wait(ep, &got, 1, 10000);
	if (n != 1 || !(got.events & EPOLLOUT) || (got.events & (EPOLLERR | EPOLLHUP)))
		FAIL("epoll_wait: %d events 0x%x, want EPOLLOUT", n, n == 1 ? got.events : 0);
	else
		printf("ok writable under epoll\n");
	close(ep);
	int soerr = -1;
	socklen_t sl = sizeof soerr;
	getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
	if (soerr != 0)
		FAIL("SO_ERROR %s", ename(soerr));
	else
		printf("ok SO_ERROR 0\n");
	int r3 = connect(fd, ai->ai_addr, ai->ai_addrlen);
	int e3 = errno;
	int r4 = connect(fd, ai->ai_addr, ai->ai_addrlen);
	int e4 = errno;
	if (!((r3 == 0 || (r3 < 0 && e3 == EISCONN)) && r4 < 0 && e4 == EISCONN))
		FAIL("connects after completion: %s then %s, want 0 or EISCONN then EISCONN", r3 == 0 ? "0" : ename(e3),
		     r4 == 0 ? "0" : ename(e4));
	else
		printf("ok connect after completion: EISCONN\n");
	struct sockaddr_storage peer;
	socklen_t pl = sizeof peer;
	if (getpeername(fd, (struct sockaddr *)&peer, &pl) < 0)
		FAIL("getpeername: %s", ename(errno));
	else if (!same_addr((struct sockaddr *)&peer, pl, ai->ai_addr, ai->ai_addrlen))
		FAIL("getpeername is not the address connected to");
	else
		printf("ok getpeername is the address connected to\n");
	/* A short buffer gets the truncated address and the full length. */
	struct sockaddr_in6 small;
	socklen_t sml = 4;
	if (getpeername(fd, (struct sockaddr *)&small, &sml) < 0 || sml != ai->ai_addrlen)
		FAIL("getpeername with a short buffer: length %u, want %u", sml, ai->ai_addrlen);
	int fl = fcntl(fd, F_GETFL);
	int fdfl = fcntl(fd, F_GETFD);
	if (!(fl & O_NONBLOCK) || !(fdfl & FD_CLOEXEC))
		FAIL("flags lost: O_NONBLOCK %d FD_CLOEXEC %d", !!(fl & O_NONBLOCK), !!(fdfl & FD_CLOEXEC));
	else
		printf("ok flags kept\n");
	if (echo(fd, "hello through the event loop") == 0)
		printf("ok echo\n");
	close(fd);
	freeaddrinfo(ai);
	return failed;
}

static int t_errno(const char *host, const char *port)
{
	struct addrinfo *ai = resolve(host, port, AF_UNSPEC);
	if (!ai)
		return 1;
	int fd = socket(ai->ai_family, SOCK_STREAM, 0);
	int r = connect(fd, ai->ai_addr, ai->ai_addrlen);
	printf("errno=%s\n", r == 0 ? "connected" : ename(errno));
	if (r == 0) {
		/* The echo server closes after our end: EOF, or a reset for a
		 * connection the far side could not complete. */
		shutdown(fd, SHUT_WR);
		char c;
		ssize_t n = read(fd, &c, 1);
		printf("read=%s\n", n == 0 ? "eof" : n > 0 ? "data" : ename(errno));
	}
	close(fd);
	freeaddrinfo(ai);
	return 0;
}

static int t_nberrno(const char *host, const char *port)
{
	struct addrinfo *ai = resolve(host, port, AF_UNSPEC);
	if (!ai)
		return 1;
	int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK, 0);
	int r = connect(fd, ai->ai_addr, ai->ai_addrlen);
	if (r < 0 && errno != EINPROGRESS) {
		printf("connect=%s\n", ename(errno));
		return 0;
	}
	struct pollfd p = { fd, POLLOUT, 0 };
	poll(&p, 1, 10000);
	int soerr = 0;
	socklen_t sl = sizeof soerr;
	getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
	printf("so_error=%s\n", ename(soerr));
	if (soerr == 0) {
		struct pollfd q = { fd, POLLIN, 0 };
		poll(&q, 1, 10000);
		char c;
		ssize_t n = read(fd, &c, 1);
		printf("read=%s\n", n == 0 ? "eof" : n > 0 ? "data" : ename(errno));
	}
	close(fd);
	freeaddrinfo(ai);
	return 0;
}

/* nbstart connects a non-blocking socket; -1 if connect said more than
 * EINPROGRESS (printed). */
static int nbstart(const char *host, const char *port, struct addrinfo **ai)
{
	*ai = resolve(host, port, AF_UNSPEC);
	if (!*ai)
		return -1;
	int fd = socket((*ai)->ai_family, SOCK_STREAM | SOCK_NONBLOCK, 0);
	if (connect(fd, (*ai)->ai_addr, (*ai)->ai_addrlen) < 0 && errno != EINPROGRESS) {
		printf("connect=%s\n", ename(errno));
		close(fd);
		freeaddrinfo(*ai);
		return -1;
	}
	return fd;
}

static int t_nbconnect(const char *host, const char *port)
{
	struct addrinfo *ai;
	int fd = nbstart(host, port, &ai);
	if (fd < 0)
		return 0;
	struct pollfd p = { fd, POLLOUT, 0 };
	poll(&p, 1, 10000);
	int r = connect(fd, ai->ai_addr, ai->ai_addrlen);
	printf("connect=%s\n", r == 0 ? "0" : ename(errno));
	close(fd);
	freeaddrinfo(ai);
	return 0;
}

static int t_nbwait(const char *host, const char *port, int ms)
{
	struct addrinfo *ai;
	int fd = nbstart(host, port, &ai);
	if (fd < 0)
		return 0;
	struct pollfd p = { fd, POLLOUT, 0 };
	int n = poll(&p, 1, ms);
	printf("within=%s\n", n == 0 ? "pending" : "woke");
	struct sockaddr_storage peer;
	socklen_t pl = sizeof peer;
	if (n == 0)
		printf("getpeername_pending=%s\n", getpeername(fd, (struct sockaddr *)&peer, &pl) == 0 ? "0" : ename(errno));
	poll(&p, 1, 10000);
	int soerr = 0;
	socklen_t sl = sizeof soerr;
	getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
	printf("so_error=%s\n", ename(soerr));
	close(fd);
	freeaddrinfo(ai);
	return 0;
}

static const char *fmt_addr(const struct sockaddr_storage *ss, char *buf, size_t n)
{
	char ip[INET6_ADDRSTRLEN] = "?";
	int port = 0;
	if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *a = (const void *)ss;
		inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
		port = ntohs(a->sin_port);
		snprintf(buf, n, "%s:%d", ip, port);
	} else if (ss->ss_family == AF_INET6) {
		const struct sockaddr_in6 *a = (const void *)ss;
		inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
		port = ntohs(a->sin6_port);
		snprintf(buf, n, "[%s]:%d", ip, port);
	} else {
		snprintf(buf, n, "family-%d", ss->ss_family);
	}
	return buf;
}

/* t_server is an epoll server, as event-loop servers are written: the
 * kernel's views (raw system calls, past any shim) are printed beside the C
 * library's. */
static int t_server(const char *fam, const char *port, int n)
{
	int six = !strcmp(fam, "6");
	int ls = socket(six ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	int one = 1;
	setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	struct sockaddr_storage ss;
	memset(&ss, 0, sizeof ss);
	socklen_t sl;
	if (six) {
		struct sockaddr_in6 *a = (void *)&ss;
		a->sin6_family = AF_INET6;
		a->sin6_addr = in6addr_any;
		a->sin6_port = htons((uint16_t)atoi(port));
		sl = sizeof *a;
	} else {
		struct sockaddr_in *a = (void *)&ss;
		a->sin_family = AF_INET;
		a->sin_addr.s_addr = htonl(INADDR_ANY);
		a->sin_port = htons((uint16_t)atoi(port));
		sl = sizeof *a;
	}
	if (bind(ls, (struct sockaddr *)&ss, sl) < 0 || listen(ls, 16) < 0) {
		printf("listen=%s\n", ename(errno));
		return 1;
	}
	char b1[80], b2[80], b3[80];
	struct sockaddr_storage got, kern;
	socklen_t gl = sizeof got, kl = sizeof kern;
	getsockname(ls, (struct sockaddr *)&got, &gl);
	syscall(SYS_getsockname, ls, (struct sockaddr *)&kern, &kl);
	printf("listening bound=%s private=%s\n", fmt_addr(&got, b1, sizeof b1), fmt_addr(&kern, b2, sizeof b2));
	int fl = fcntl(ls, F_GETFL);
	fcntl(ls, F_SETFL, fl | O_NONBLOCK);
	int ep = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ev = { .events = EPOLLIN, .data.fd = ls };
	epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
	for (int served = 0; served < n;) {
		struct epoll_event e;
		if (epoll_wait(ep, &e, 1, 30000) != 1) {
			FAIL("no client within 30 s");
			return 1;
		}
		struct sockaddr_storage peer;
		socklen_t pl = sizeof peer;
		int c = accept4(ls, (struct sockaddr *)&peer, &pl, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (c < 0) {
			if (errno != EAGAIN && errno != ECONNABORTED)
				FAIL("accept4: %s", ename(errno));
			continue;
		}
		struct sockaddr_storage p2, kp, lo;
		socklen_t p2l = sizeof p2, kpl = sizeof kp, lol = sizeof lo;
		getpeername(c, (struct sockaddr *)&p2, &p2l);
		syscall(SYS_getpeername, c, (struct sockaddr *)&kp, &kpl);
		getsockname(c, (struct sockaddr *)&lo, &lol);
		if (!same_addr((struct sockaddr *)&peer, pl, (struct sockaddr *)&p2, p2l))
			FAIL("accept4's address differs from getpeername's");
		printf("client peer=%s kernel_peer=%s local=%s nonblock=%d cloexec=%d\n", fmt_addr(&p2, b1, sizeof b1),
		       fmt_addr(&kp, b2, sizeof b2), fmt_addr(&lo, b3, sizeof b3), !!(fcntl(c, F_GETFL) & O_NONBLOCK),
		       !!(fcntl(c, F_GETFD) & FD_CLOEXEC));
		fcntl(c, F_SETFL, fcntl(c, F_GETFL) & ~O_NONBLOCK);
		char buf[65536];
		ssize_t r;
		while ((r = read(c, buf, sizeof buf)) > 0)
			if (write(c, buf, (size_t)r) != r)
				break;
		close(c);
		served++;
	}
	close(ep);
	close(ls);
	return failed;
}

struct targ {
	const char *host, *port;
	int id, ok;
};

static void *thread_main(void *p)
{
	struct targ *a = p;
	int fd = connect_blocking(a->host, a->port, AF_UNSPEC);
	if (fd < 0)
		return NULL;
	char msg[64];
	snprintf(msg, sizeof msg, "thread %d says hello", a->id);
	a->ok = echo(fd, msg) == 0;
	close(fd);
	return NULL;
}

static int t_threads(const char *host, const char *port, int n)
{
	pthread_t th[256];
	struct targ args[256];
	if (n > 256)
		n = 256;
	for (int i = 0; i < n; i++) {
		args[i] = (struct targ){ host, port, i, 0 };
		pthread_create(&th[i], NULL, thread_main, &args[i]);
	}
	int good = 0;
	for (int i = 0; i < n; i++) {
		pthread_join(th[i], NULL);
		good += args[i].ok;
	}
	if (good != n)
		FAIL("%d of %d threads echoed", good, n);
	else
		printf("ok %d threads\n", n);
	return failed;
}

static int connect_echo(const char *host, const char *port, const char *msg)
{
	int fd = connect_blocking(host, port, AF_UNSPEC);
	if (fd < 0)
		return -1;
	int r = echo(fd, msg);
	close(fd);
	return r;
}

static int t_daemon(const char *uid, const char *host, const char *port)
{
	if (connect_echo(host, port, "master") != 0)
		return 1;
	printf("ok master\n");
	pid_t pid = fork();
	if (pid == 0) {
		/* As nginx's workers: no environment, another user. */
		clearenv();
		uid_t u = (uid_t)atoi(uid);
		if (setgroups(0, NULL) < 0 || setgid(u) < 0 || setuid(u) < 0) {
			FAIL("becoming uid %u: %s", u, ename(errno));
			_exit(1);
		}
		int r = connect_echo(host, port, "worker");
		_exit(r == 0 && !failed ? 0 : 1);
	}
	int st;
	waitpid(pid, &st, 0);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		FAIL("worker: status 0x%x", st);
		return 1;
	}
	printf("ok worker as uid %s\n", uid);
	return 0;
}

static double now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static int t_connbench(const char *host, const char *port, int n, int nb)
{
	if (n < 1 || n > 100000)
		return 2;
	struct addrinfo *ai = resolve(host, port, AF_UNSPEC);
	if (!ai)
		return 1;
	double *conn = calloc((size_t)n, sizeof *conn), *echo = calloc((size_t)n, sizeof *echo);
	for (int i = 0; i < n; i++) {
		double t0 = now_us();
		int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | (nb ? SOCK_NONBLOCK : 0), 0);
		if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
			if (!nb || errno != EINPROGRESS) {
				FAIL("connect %d: %s", i, ename(errno));
				return 1;
			}
			struct pollfd p = { fd, POLLOUT, 0 };
			int soerr = -1;
			socklen_t sl = sizeof soerr;
			if (poll(&p, 1, 10000) != 1 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0 || soerr != 0) {
				FAIL("non-blocking connect %d: SO_ERROR %s", i, ename(soerr));
				return 1;
			}
			fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
		}
		double t1 = now_us();
		char c = 'x';
		if (write(fd, &c, 1) != 1 || read(fd, &c, 1) != 1) {
			FAIL("echo %d: %s", i, ename(errno));
			return 1;
		}
		double t2 = now_us();
		close(fd);
		conn[i] = t1 - t0;
		echo[i] = t2 - t0;
	}
	qsort(conn, (size_t)n, sizeof *conn, cmp_double);
	qsort(echo, (size_t)n, sizeof *echo, cmp_double);
	printf("connect_us=%.1f connect_p90_us=%.1f echo_us=%.1f echo_p90_us=%.1f\n", conn[n / 2], conn[n * 9 / 10],
	       echo[n / 2], echo[n * 9 / 10]);
	free(conn);
	free(echo);
	freeaddrinfo(ai);
	return 0;
}

static int t_fork(const char *host, const char *port, const char *self)
{
	if (connect_echo(host, port, "parent before fork") == 0)
		printf("ok parent before fork\n");
	/* A connection open across the fork, used by both afterwards. */
	pid_t pid = fork();
	if (pid == 0) {
		int r = connect_echo(host, port, "child without exec");
		_exit(r == 0 && !failed ? 0 : 1);
	}
	int st;
	waitpid(pid, &st, 0);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
		FAIL("child without exec: status 0x%x", st);
	else
		printf("ok child without exec\n");
	pid = fork();
	if (pid == 0) {
		execl(self, self, "echo", host, port, (char *)NULL);
		_exit(127);
	}
	waitpid(pid, &st, 0);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
		FAIL("child with exec: status 0x%x", st);
	else
		printf("ok child with exec\n");
	/* A grandchild of a parent that exits at once: a daemon. */
	int pfd[2];
	if (pipe(pfd) < 0)
		return 1;
	pid = fork();
	if (pid == 0) {
		if (fork() == 0) {
			close(pfd[0]);
			struct timespec ts = { 0, 200000000 };
			nanosleep(&ts, NULL); /* outlive the middle process */
			char r = connect_echo(host, port, "daemon") == 0 ? 'y' : 'n';
			ssize_t w = write(pfd[1], &r, 1);
			(void)w;
			_exit(0);
		}
		_exit(0);
	}
	close(pfd[1]);
	waitpid(pid, &st, 0);
	char r = 0;
	if (read(pfd[0], &r, 1) != 1 || r != 'y')
		FAIL("daemonized grandchild could not connect");
	else
		printf("ok daemonized grandchild\n");
	if (connect_echo(host, port, "parent after fork") == 0)
		printf("ok parent after fork\n");
	return failed;
}

static int t_closeall(const char *host, const char *port)
{
	/* A first connect opens the shim's channel to the agent. */
	if (connect_echo(host, port, "before closing everything") != 0)
		return 1;
	struct rlimit rl;
	getrlimit(RLIMIT_NOFILE, &rl);
	int max = rl.rlim_cur > 4096 ? 4096 : (int)rl.rlim_cur;
	/* What daemons do at start-up, every way at once. */
	if (close_range(3, ~0U, 0) < 0)
		FAIL("close_range: %s", strerror(errno));
	closefrom(3);
	for (int fd = 3; fd < max; fd++)
		close(fd);
	int null = open("/dev/null", O_RDONLY);
	for (int fd = 3; fd < max; fd++)
		if (fd != null)
			dup2(null, fd);
	for (int fd = 3; fd < max; fd++)
		close(fd);
	printf("ok closed and overwrote every descriptor up to %d\n", max);
	if (connect_echo(host, port, "after closing everything") == 0)
		printf("ok connect after closing everything\n");
	/* Nothing the program did not open itself is left. */
	int open_fds = 0;
	for (int fd = 3; fd < max; fd++)
		if (fcntl(fd, F_GETFD) >= 0)
			open_fds++;
	if (open_fds != 0)
		FAIL("%d descriptors visible to the program after closing all", open_fds);
	else
		printf("ok no descriptor visible\n");
	return failed;
}

static int t_sockopt(const char *host, const char *port)
{
	struct addrinfo *ai = resolve(host, port, AF_UNSPEC);
	if (!ai)
		return 1;
	int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	int one = 1, rcvbuf = 96 * 1024;
	struct linger lg = { 1, 7 };
	setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
	setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
	int idle = 77;
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
	if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
		FAIL("connect: %s", ename(errno));
		return 1;
	}
	int v = 0;
	socklen_t l = sizeof v;
	getsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &v, &l);
	if (!v)
		FAIL("SO_KEEPALIVE lost");
	l = sizeof v;
	getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, &l);
	if (!v)
		FAIL("TCP_NODELAY lost");
	l = sizeof v;
	getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, &l);
	if (v != 2 * rcvbuf)
		FAIL("SO_RCVBUF %d, want %d", v, 2 * rcvbuf);
	struct linger g;
	l = sizeof g;
	getsockopt(fd, SOL_SOCKET, SO_LINGER, &g, &l);
	if (!g.l_onoff || g.l_linger != 7)
		FAIL("SO_LINGER %d/%d, want 1/7", g.l_onoff, g.l_linger);
	l = sizeof v;
	getsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &v, &l);
	if (v != 77)
		FAIL("TCP_KEEPIDLE %d, want 77", v);
	if (!(fcntl(fd, F_GETFD) & FD_CLOEXEC))
		FAIL("FD_CLOEXEC lost");
	if (fcntl(fd, F_GETFL) & O_NONBLOCK)
		FAIL("O_NONBLOCK appeared");
	if (!failed)
		printf("ok options kept\n");
	if (echo(fd, "options") == 0)
		printf("ok echo\n");
	close(fd);
	freeaddrinfo(ai);
	return failed;
}

static int t_names(const char *host)
{
	struct addrinfo *ai = resolve(host, "80", AF_UNSPEC);
	if (!ai)
		return 1;
	char ip[INET6_ADDRSTRLEN], name[NI_MAXHOST];
	if (ai->ai_family == AF_INET)
		inet_ntop(AF_INET, &((struct sockaddr_in *)ai->ai_addr)->sin_addr, ip, sizeof ip);
	else
		inet_ntop(AF_INET6, &((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr, ip, sizeof ip);
	printf("getaddrinfo=%s\n", ip);
	int r = getnameinfo(ai->ai_addr, ai->ai_addrlen, name, sizeof name, NULL, 0, NI_NAMEREQD);
	printf("getnameinfo=%s\n", r == 0 ? name : gai_strerror(r));
	freeaddrinfo(ai);
	struct addrinfo h6 = { .ai_family = AF_INET6, .ai_socktype = SOCK_STREAM }, *a6;
	if (getaddrinfo(host, "80", &h6, &a6) == 0) {
		inet_ntop(AF_INET6, &((struct sockaddr_in6 *)a6->ai_addr)->sin6_addr, ip, sizeof ip);
		printf("getaddrinfo6=%s\n", ip);
		freeaddrinfo(a6);
	}
	struct addrinfo hints = { .ai_flags = AI_CANONNAME, .ai_socktype = SOCK_STREAM }, *c;
	if (getaddrinfo(host, "http", &hints, &c) == 0) {
		printf("canonname=%s port=%d\n", c->ai_canonname ? c->ai_canonname : "(null)",
		       ntohs(((struct sockaddr_in *)c->ai_addr)->sin_port));
		freeaddrinfo(c);
	}
	struct hostent *h = gethostbyname(host);
	if (h) {
		inet_ntop(h->h_addrtype, h->h_addr_list[0], ip, sizeof ip);
		printf("gethostbyname=%s %s\n", h->h_name, ip);
	} else {
		printf("gethostbyname=h_errno%d\n", h_errno);
	}
	h = gethostbyname2(host, AF_INET6);
	if (h) {
		inet_ntop(h->h_addrtype, h->h_addr_list[0], ip, sizeof ip);
		printf("gethostbyname2=%s\n", ip);
	}
	struct hostent he, *res = NULL;
	char buf[1024];
	int herr = 0;
	r = gethostbyname_r(host, &he, buf, sizeof buf, &res, &herr);
	if (r == 0 && res) {
		inet_ntop(res->h_addrtype, res->h_addr_list[0], ip, sizeof ip);
		printf("gethostbyname_r=%s\n", ip);
	} else {
		printf("gethostbyname_r=error%d h_errno%d\n", r, herr);
	}
	char tiny[8];
	r = gethostbyname_r(host, &he, tiny, sizeof tiny, &res, &herr);
	printf("gethostbyname_r(small)=%s\n", r == ERANGE ? "ERANGE" : r == 0 && res ? "ok" : "other");
	return 0;
}

static int t_udp(const char *host, const char *port)
{
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_DGRAM }, *ai;
	int r = getaddrinfo(host, port, &hints, &ai);
	if (r != 0) {
		printf("getaddrinfo=%s\n", gai_strerror(r));
		return 0;
	}
	int fd = socket(AF_INET, SOCK_DGRAM, 0);
	ssize_t n = sendto(fd, "x", 1, 0, ai->ai_addr, ai->ai_addrlen);
	printf("sendto=%s\n", n == 1 ? "sent" : ename(errno));
	r = connect(fd, ai->ai_addr, ai->ai_addrlen);
	printf("connect=%s\n", r == 0 ? "connected" : ename(errno));
	close(fd);
	/* Another datagram protocol, which vlink does not carry. */
	fd = socket(AF_INET, SOCK_DGRAM, IPPROTO_UDPLITE);
	if (fd < 0) {
		printf("udplite=unsupported\n");
	} else {
		r = connect(fd, ai->ai_addr, ai->ai_addrlen);
		printf("udplite=%s\n", r == 0 ? "connected" : ename(errno));
		close(fd);
	}
	freeaddrinfo(ai);
	return 0;
}

/* from_ai reports whether a datagram's source address (a, of al bytes)
 * is the address connected to, byte for byte. */
static int from_ai(const struct sockaddr_storage *a, socklen_t al, const struct addrinfo *ai)
{
	return same_addr((const struct sockaddr *)a, al, ai->ai_addr, ai->ai_addrlen);
}

/* udp_connected returns a UDP socket of family af (IPv4 addresses mapped
 * on an IPv6 one) connected to host and port, whose address it puts in
 * *ai, with a receive timeout of secs; -1 after a FAIL line. */
static int udp_connected(int af, const char *host, const char *port, int secs, struct addrinfo **ai)
{
	struct addrinfo hints = { .ai_family = af, .ai_socktype = SOCK_DGRAM, .ai_flags = af == AF_INET6 ? AI_V4MAPPED : 0 };
	int r = getaddrinfo(host, port, &hints, ai);
	if (r != 0) {
		FAIL("getaddrinfo %s: %s", host, gai_strerror(r));
		return -1;
	}
	int fd = socket(af, SOCK_DGRAM, 0);
	if (connect(fd, (*ai)->ai_addr, (*ai)->ai_addrlen) < 0) {
		FAIL("connect: %s", ename(errno));
		return -1;
	}
	struct timeval tv = { secs, 0 };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	return fd;
}

static int t_udpecho(const char *fam, const char *host, const char *port)
{
	char sb[INET6_ADDRSTRLEN + 8];
	struct addrinfo *ai;
	int r, fd = udp_connected(strcmp(fam, "6") == 0 ? AF_INET6 : AF_INET, host, port, 10, &ai);
	if (fd < 0)
		return 1;
	struct sockaddr_storage from;
	socklen_t fl = sizeof from;
	if (getpeername(fd, (struct sockaddr *)&from, &fl) < 0 || !from_ai(&from, fl, ai))
		FAIL("getpeername: %s, not the address connected to", fmt_addr(&from, sb, sizeof sb));

	char buf[65536];
	/* send, recvfrom */
	fl = sizeof from;
	ssize_t n = send(fd, "one", 3, 0);
	if (n == 3)
		n = recvfrom(fd, buf, sizeof buf, 0, (struct sockaddr *)&from, &fl);
	if (n != 3 || memcmp(buf, "one", 3) != 0 || !from_ai(&from, fl, ai))
		FAIL("send, recvfrom: %zd bytes (%s) from %s", n, ename(errno), fmt_addr(&from, sb, sizeof sb));
	else
		printf("ok recvfrom\n");

	/* sendto the address connected to, recvmsg */
	struct iovec iov = { buf, sizeof buf };
	struct msghdr mh = { .msg_name = &from, .msg_namelen = sizeof from, .msg_iov = &iov, .msg_iovlen = 1 };
	n = sendto(fd, "two", 3, 0, ai->ai_addr, ai->ai_addrlen);
	if (n == 3)
		n = recvmsg(fd, &mh, 0);
	if (n != 3 || memcmp(buf, "two", 3) != 0 || !from_ai(&from, mh.msg_namelen, ai))
		FAIL("sendto, recvmsg: %zd bytes (%s) from %s", n, ename(errno), fmt_addr(&from, sb, sizeof sb));
	else
		printf("ok recvmsg\n");

	/* sendmmsg with the address, recvmmsg */
	const char *words[2] = { "three", "four!" };
	struct iovec oiov[2], iiov[2];
	struct mmsghdr out[2], in[2];
	struct sockaddr_storage froms[2];
	char ibuf[2][16];
	memset(out, 0, sizeof out);
	memset(in, 0, sizeof in);
	for (int k = 0; k < 2; k++) {
		oiov[k] = (struct iovec){ (void *)words[k], 5 };
		out[k].msg_hdr = (struct msghdr){ .msg_name = ai->ai_addr, .msg_namelen = ai->ai_addrlen, .msg_iov = &oiov[k], .msg_iovlen = 1 };
		iiov[k] = (struct iovec){ ibuf[k], sizeof ibuf[k] };
		in[k].msg_hdr = (struct msghdr){ .msg_name = &froms[k], .msg_namelen = sizeof froms[k], .msg_iov = &iiov[k], .msg_iovlen = 1 };
	}
	r = sendmmsg(fd, out, 2, 0);
	if (r != 2 || out[0].msg_hdr.msg_name != ai->ai_addr || out[1].msg_hdr.msg_name != ai->ai_addr)
		FAIL("sendmmsg: %d (%s), or the addresses not given back", r, ename(errno));
	int got = 0;
	while (r == 2 && got < 2) {
		int m = recvmmsg(fd, in + got, 2 - got, MSG_WAITFORONE, NULL);
		if (m <= 0)
			break;
		got += m;
	}
	int okm = got == 2;
	for (int k = 0; okm && k < 2; k++)
		okm = in[k].msg_len == 5 && memcmp(ibuf[k], words[k], 5) == 0 && from_ai(&froms[k], in[k].msg_hdr.msg_namelen, ai);
	if (!okm)
		FAIL("sendmmsg, recvmmsg: %d of 2 (%s)", got, ename(errno));
	else
		printf("ok recvmmsg\n");

	/* a large datagram, whole */
	static char big[60000];
	for (size_t k = 0; k < sizeof big; k++)
		big[k] = (char)(k * 7 + k / 251);
	n = write(fd, big, sizeof big);
	if (n == (ssize_t)sizeof big)
		n = read(fd, buf, sizeof buf);
	if (n != (ssize_t)sizeof big || memcmp(buf, big, sizeof big) != 0)
		FAIL("a datagram of %zu bytes: %zd back (%s)", sizeof big, n, ename(errno));
	else
		printf("ok large datagram\n");
	close(fd);
	freeaddrinfo(ai);
	if (!failed)
		printf("ok udp echo\n");
	return failed;
}

static int t_udpsendto(const char *fam, const char *host, const char *port)
{
	char sb[INET6_ADDRSTRLEN + 8];
	int af = strcmp(fam, "6") == 0 ? AF_INET6 : AF_INET;
	struct addrinfo hints = { .ai_family = af, .ai_socktype = SOCK_DGRAM, .ai_flags = af == AF_INET6 ? AI_V4MAPPED : 0 };
	struct addrinfo *dst[2];
	if (getaddrinfo(host, port, &hints, &dst[0]) != 0 || getaddrinfo("127.0.0.1", port, &hints, &dst[1]) != 0) {
		FAIL("getaddrinfo %s", host);
		return 1;
	}
	char buf[256];
	struct sockaddr_storage from;
	socklen_t fl;
	/* Two sockets, one after the other: the second must not be taken for
	 * the first. */
	int first = socket(af, SOCK_DGRAM, 0), fd = first;
	struct timeval tv = { 10, 0 };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	for (int round = 0; round < 2; round++) {
		if (round == 1) {
			fd = socket(af, SOCK_DGRAM, 0);
			setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
		}
		for (int d = 0; d < 2; d++) {
			const struct addrinfo *ai = dst[d];
			fl = sizeof from;
			ssize_t n = sendto(fd, "sendto", 6, 0, ai->ai_addr, ai->ai_addrlen);
			if (n == 6)
				n = recvfrom(fd, buf, sizeof buf, 0, (struct sockaddr *)&from, &fl);
			if (n != 6 || memcmp(buf, "sendto", 6) != 0 || !from_ai(&from, fl, ai))
				FAIL("sendto %d: %zd bytes (%s) from %s", d, n, ename(errno), fmt_addr(&from, sb, sizeof sb));
			struct iovec iov = { "sendmsg", 7 }, riov = { buf, sizeof buf };
			struct msghdr mh = { .msg_name = ai->ai_addr, .msg_namelen = ai->ai_addrlen, .msg_iov = &iov, .msg_iovlen = 1 };
			struct msghdr rh = { .msg_name = &from, .msg_namelen = sizeof from, .msg_iov = &riov, .msg_iovlen = 1 };
			n = sendmsg(fd, &mh, 0);
			if (n == 7)
				n = recvmsg(fd, &rh, 0);
			if (n != 7 || memcmp(buf, "sendmsg", 7) != 0 || !from_ai(&from, rh.msg_namelen, ai))
				FAIL("sendmsg %d: %zd bytes (%s) from %s", d, n, ename(errno), fmt_addr(&from, sb, sizeof sb));
		}
	}
	/* One call to both: each answer from the address it went to. */
	const char *words[2] = { "to-host", "to-lo!!" };
	struct iovec oiov[2];
	struct mmsghdr out[2];
	memset(out, 0, sizeof out);
	for (int d = 0; d < 2; d++) {
		oiov[d] = (struct iovec){ (void *)words[d], 7 };
		out[d].msg_hdr = (struct msghdr){ .msg_name = dst[d]->ai_addr, .msg_namelen = dst[d]->ai_addrlen, .msg_iov = &oiov[d], .msg_iovlen = 1 };
	}
	int r = sendmmsg(fd, out, 2, 0);
	if (r != 2 || out[0].msg_len != 7 || out[1].msg_len != 7)
		FAIL("sendmmsg: %d (%s)", r, ename(errno));
	for (int k = 0; r == 2 && k < 2; k++) {
		fl = sizeof from;
		ssize_t n = recvfrom(fd, buf, sizeof buf, 0, (struct sockaddr *)&from, &fl);
		int d = n == 7 && memcmp(buf, words[1], 7) == 0;
		if (n != 7 || memcmp(buf, words[d], 7) != 0 || !from_ai(&from, fl, dst[d]))
			FAIL("sendmmsg's answer %d: %zd bytes (%s) from %s", k, n, ename(errno), fmt_addr(&from, sb, sizeof sb));
	}
	close(fd);
	close(first);
	if (!failed)
		printf("ok udp sendto\n");
	return failed;
}

static int t_sndtimeo(const char *host, const char *port, const char *ms)
{
	struct addrinfo *ai = resolve(host, port, AF_INET);
	if (!ai)
		return 1;
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	long m = atol(ms);
	struct timeval tv = { m / 1000, (m % 1000) * 1000 };
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	int r = connect(fd, ai->ai_addr, ai->ai_addrlen);
	int e = errno;
	clock_gettime(CLOCK_MONOTONIC, &t1);
	long el = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
	printf("connect=%s after %s\n", r == 0 ? "connected" : ename(e), el >= m ? "the timeout" : "less than the timeout");
	freeaddrinfo(ai);
	if (r < 0 && e == EINPROGRESS) {
		struct pollfd p = { fd, POLLOUT, 0 };
		poll(&p, 1, 10000);
		int err = -1;
		socklen_t l = sizeof err;
		getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l);
		printf("later=%s\n", err == 0 ? "connected" : ename(err));
		r = err == 0 ? 0 : -1;
	}
	if (r == 0 && echo(fd, "after the timeout") == 0)
		printf("ok echo\n");
	close(fd);
	return failed;
}

static int t_oob(const char *host, const char *port)
{
	struct addrinfo *ai = resolve(host, port, AF_INET);
	if (!ai)
		return 1;
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
		FAIL("connect: %s", ename(errno));
		return 1;
	}
	freeaddrinfo(ai);
	ssize_t n = send(fd, "!", 1, MSG_OOB);
	printf("oob=%s\n", n == 1 ? "sent" : ename(errno));
	if (echo(fd, "after the urgent byte") == 0)
		printf("ok echo\n");
	close(fd);
	return failed;
}

static int t_udprefused(const char *host, const char *port)
{
	struct addrinfo *ai;
	int fd = udp_connected(AF_INET, host, port, 1, &ai);
	if (fd < 0)
		return 1;
	freeaddrinfo(ai);
	char buf[16];
	for (int k = 1; k <= 5; k++) {
		ssize_t n = send(fd, "ping", 4, 0);
		if (n == 4)
			n = recv(fd, buf, sizeof buf, 0);
		if (n < 0 && errno == ECONNREFUSED) {
			printf("refused after %d sends\n", k);
			return 0;
		}
		if (n >= 0) {
			FAIL("an answer from a port where nothing listens");
			return 1;
		}
		printf("send %d: %s\n", k, ename(errno));
	}
	FAIL("never refused");
	return 1;
}

/* An IPv4 address on an IPv6 socket: the kernel's EAFNOSUPPORT, routed or not. */
static int t_afmismatch(const char *ip, const char *port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(port)) };
	inet_pton(AF_INET, ip, &a.sin_addr);
	int fd = socket(AF_INET6, SOCK_STREAM, 0);
	int r = connect(fd, (struct sockaddr *)&a, sizeof a);
	printf("connect=%s\n", r == 0 ? "connected" : ename(errno));
	close(fd);
	return 0;
}

static int t_execpeer(const char *host, const char *port, const char *self)
{
	int fd = connect_blocking(host, port, AF_INET);
	if (fd < 0)
		return 1;
	fcntl(fd, F_SETFD, 0); /* inherited across exec */
	char fds[16];
	snprintf(fds, sizeof fds, "%d", fd);
	struct sockaddr_in peer;
	socklen_t pl = sizeof peer;
	getpeername(fd, (struct sockaddr *)&peer, &pl);
	char ip[INET_ADDRSTRLEN];
	inet_ntop(AF_INET, &peer.sin_addr, ip, sizeof ip);
	printf("before=%s:%d\n", ip, ntohs(peer.sin_port));
	fflush(stdout);
	execl(self, self, "peerof", fds, (char *)NULL);
	FAIL("exec: %s", strerror(errno));
	return 1;
}

static int t_peerof(int fd)
{
	struct sockaddr_in peer;
	socklen_t pl = sizeof peer;
	if (getpeername(fd, (struct sockaddr *)&peer, &pl) < 0) {
		FAIL("getpeername: %s", ename(errno));
		return 1;
	}
	char ip[INET_ADDRSTRLEN];
	inet_ntop(AF_INET, &peer.sin_addr, ip, sizeof ip);
	printf("after=%s:%d\n", ip, ntohs(peer.sin_port));
	return 0;
}

static void on_alarm(int sig)
{
	(void)sig;
}

static int t_steps(const char *host, const char *port)
{
	struct addrinfo *ai = resolve(host, port, AF_UNSPEC);
	if (!ai)
		return 1;
	char line[64];
	while (fgets(line, sizeof line, stdin)) {
		int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (!strncmp(line, "opt", 3)) {
			int idle = 77;
			setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
		}
		if (!strncmp(line, "intr", 4)) {
			struct sigaction sa;
			memset(&sa, 0, sizeof sa);
			sa.sa_handler = on_alarm; /* no SA_RESTART: the connect returns EINTR */
			sigemptyset(&sa.sa_mask);
			sigaction(SIGALRM, &sa, NULL);
			struct itimerval it = { { 0, 0 }, { 0, 300000 } };
			setitimer(ITIMER_REAL, &it, NULL);
			int r = connect(fd, ai->ai_addr, ai->ai_addrlen);
			printf("errno=%s then ", r == 0 ? "connected" : ename(errno));
			if (r == 0) {
				printf("\n");
				close(fd);
				continue;
			}
		}
		int nb = !strncmp(line, "nb", 2);
		if (nb)
			fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
		int r = connect(fd, ai->ai_addr, ai->ai_addrlen);
		if (r < 0 && nb && errno == EINPROGRESS) {
			struct pollfd p = { .fd = fd, .events = POLLOUT };
			int soerr = ETIMEDOUT;
			socklen_t sl = sizeof soerr;
			if (poll(&p, 1, 10000) == 1)
				getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
			errno = soerr;
			r = soerr ? -1 : 0;
			fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
		}
		if (r < 0) {
			printf("errno=%s\n", ename(errno));
			close(fd);
			continue;
		}
		struct sockaddr_storage peer;
		socklen_t pl = sizeof peer;
		int peer_ok = getpeername(fd, (struct sockaddr *)&peer, &pl) == 0 &&
			      same_addr((struct sockaddr *)&peer, pl, ai->ai_addr, ai->ai_addrlen);
		int idle = 0;
		socklen_t il = sizeof idle;
		getsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, &il);
		int echoed = echo(fd, "step by step") == 0;
		printf("errno=connected peer=%s keepidle=%d echo=%s\n", peer_ok ? "ok" : "WRONG", idle,
		       echoed ? "ok" : "WRONG");
		close(fd);
	}
	freeaddrinfo(ai);
	return failed;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc < 2)
		return 2;
	const char *t = argv[1];
	if (!strcmp(t, "nonblock") && argc == 4)
		return t_nonblock(argv[2], argv[3]);
	if (!strcmp(t, "errno") && argc == 4)
		return t_errno(argv[2], argv[3]);
	if (!strcmp(t, "nberrno") && argc == 4)
		return t_nberrno(argv[2], argv[3]);
	if (!strcmp(t, "nbconnect") && argc == 4)
		return t_nbconnect(argv[2], argv[3]);
	if (!strcmp(t, "nbwait") && argc == 5)
		return t_nbwait(argv[2], argv[3], atoi(argv[4]));
	if (!strcmp(t, "threads") && argc == 5)
		return t_threads(argv[2], argv[3], atoi(argv[4]));
	if (!strcmp(t, "fork") && argc == 5)
		return t_fork(argv[2], argv[3], argv[4]);
	if (!strcmp(t, "echo") && argc == 4)
		return connect_echo(argv[2], argv[3], "child with exec") == 0 && !failed ? 0 : 1;
	if (!strcmp(t, "closeall") && argc == 4)
		return t_closeall(argv[2], argv[3]);
	if (!strcmp(t, "sockopt") && argc == 4)
		return t_sockopt(argv[2], argv[3]);
	if (!strcmp(t, "names") && argc == 3)
		return t_names(argv[2]);
	if (!strcmp(t, "udpsendto") && argc == 5)
		return t_udpsendto(argv[2], argv[3], argv[4]);
	if (!strcmp(t, "oob") && argc == 4)
		return t_oob(argv[2], argv[3]);
	if (!strcmp(t, "sndtimeo") && argc == 5)
		return t_sndtimeo(argv[2], argv[3], argv[4]);
	if (!strcmp(t, "udprefused") && argc == 4)
		return t_udprefused(argv[2], argv[3]);
	if (!strcmp(t, "udpecho") && argc == 5)
		return t_udpecho(argv[2], argv[3], argv[4]);
	if (!strcmp(t, "udp") && argc == 4)
		return t_udp(argv[2], argv[3]);
	if (!strcmp(t, "afmismatch") && argc == 4)
		return t_afmismatch(argv[2], argv[3]);
	if (!strcmp(t, "connbench") && (argc == 5 || (argc == 6 && !strcmp(argv[5], "nb"))))
		return t_connbench(argv[2], argv[3], atoi(argv[4]), argc == 6);
	if (!strcmp(t, "daemon") && argc == 5)
		return t_daemon(argv[2], argv[3], argv[4]);
	if (!strcmp(t, "execpeer") && argc == 5)
		return t_execpeer(argv[2], argv[3], argv[4]);
	if (!strcmp(t, "server") && argc == 5)
		return t_server(argv[2], argv[3], atoi(argv[4]));
	if (!strcmp(t, "steps") && argc == 4)
		return t_steps(argv[2], argv[3]);
	if (!strcmp(t, "peerof") && argc == 3)
		return t_peerof(atoi(argv[2]));
	fprintf(stderr, "conntest: bad arguments\n");
	return 2;
}
