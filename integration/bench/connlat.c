/*
 * connlat: the latency of connect(2) to a local listener, N times, for
 * preload.sh to run with and without the preload shim. Each connect is a
 * blocking TCP connect to 127.0.0.1 timed with CLOCK_MONOTONIC; the
 * connection is then reset (SO_LINGER 0) so no TIME_WAIT piles up. A thread
 * accepts and closes. Prints: n, median, p90, p99 and mean, in
 * microseconds.
 *
 * usage: connlat [N]      (default 10000)
 *
 * Two more modes, for connect_cost.sh: a one-byte server, and a client that
 * times connect to the first byte of its answer through whatever relays,
 * proxies or preload shims sit between them.
 *
 *   connlat serve PORT            accept on 127.0.0.1:PORT; to each
 *                                 connection write one byte, then close
 *   connlat ttfb HOST PORT N [W]  W warm-up connects (default 20), then N
 *                                 blocking connects, each reading the one
 *                                 byte and closing. Prints n, the medians
 *                                 of connect and of connect to first byte,
 *                                 the p90 of the latter (us), and this
 *                                 process's CPU seconds (a preload shim's
 *                                 included). A refused connect, or a
 *                                 stream that ends without its byte, is an
 *                                 error (exit 1): an error must not pass
 *                                 for a fast empty answer.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int lfd;

static void *acceptor(void *arg)
{
	(void)arg;
	for (;;) {
		int c = accept(lfd, NULL, NULL);
		if (c < 0)
			return NULL;
		close(c);
	}
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double since(const struct timespec *t0, const struct timespec *t1)
{
	return (double)(t1->tv_sec - t0->tv_sec) * 1e6 + (double)(t1->tv_nsec - t0->tv_nsec) / 1e3;
}

static int serve(int port)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(fd, 4096) < 0) {
		perror("serve");
		return 1;
	}
	for (;;) {
		int c = accept(fd, NULL, NULL);
		if (c < 0)
			continue;
		/* The server closes first: its TIME_WAIT is on a fixed port and
		 * the client's side never holds one. */
		if (write(c, "x", 1) != 1)
			perror("write");
		close(c);
	}
}

static int ttfb(const char *host, int port, int n, int warm)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	if (n <= 0 || warm < 0)
		return 2;
	if (inet_pton(AF_INET, host, &a.sin_addr) != 1) {
		fprintf(stderr, "ttfb: %s is not an IPv4 address\n", host);
		return 2;
	}
	double *conn = malloc(sizeof *conn * (size_t)n), *first = malloc(sizeof *first * (size_t)n);
	for (int i = -warm; i < n; i++) {
		int fd = socket(AF_INET, SOCK_STREAM, 0);
		struct timespec t0, t1, t2;
		char b;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
			perror("ttfb: connect");
			return 1;
		}
		clock_gettime(CLOCK_MONOTONIC, &t1);
		ssize_t r = read(fd, &b, 1);
		clock_gettime(CLOCK_MONOTONIC, &t2);
		if (r != 1) {
			if (r < 0)
				perror("ttfb: read");
			else
				fprintf(stderr, "ttfb: connection %d ended without its byte\n", i);
			return 1;
		}
		close(fd);
		if (i >= 0) {
			conn[i] = since(&t0, &t1);
			first[i] = since(&t0, &t2);
		}
	}
	qsort(conn, (size_t)n, sizeof *conn, cmp);
	qsort(first, (size_t)n, sizeof *first, cmp);
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	printf("n=%d connect=%.2f first=%.2f p90=%.2f cpu=%.3f\n", n, conn[n / 2], first[n / 2], first[n * 9 / 10],
	       (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc > 2 && strcmp(argv[1], "serve") == 0)
		return serve(atoi(argv[2]));
	if (argc > 4 && strcmp(argv[1], "ttfb") == 0)
		return ttfb(argv[2], atoi(argv[3]), atoi(argv[4]), argc > 5 ? atoi(argv[5]) : 20);
	int n = argc > 1 ? atoi(argv[1]) : 10000;
	if (n <= 0)
		return 2;
	lfd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t al = sizeof a;
	if (bind(lfd, (struct sockaddr *)&a, sizeof a) < 0 || listen(lfd, 4096) < 0 ||
	    getsockname(lfd, (struct sockaddr *)&a, &al) < 0) {
		perror("listen");
		return 1;
	}
	pthread_t t;
	pthread_create(&t, NULL, acceptor, NULL);
	double *us = malloc(sizeof *us * (size_t)n);
	struct linger lg = { 1, 0 };
	for (int i = 0; i < n; i++) {
		int fd = socket(AF_INET, SOCK_STREAM, 0);
		struct timespec t0, t1;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		int r = connect(fd, (struct sockaddr *)&a, sizeof a);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		if (r < 0) {
			perror("connect");
			return 1;
		}
		us[i] = (double)(t1.tv_sec - t0.tv_sec) * 1e6 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e3;
		setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
		close(fd);
	}
	double sum = 0;
	for (int i = 0; i < n; i++)
		sum += us[i];
	qsort(us, (size_t)n, sizeof *us, cmp);
	printf("n=%d median=%.2f p90=%.2f p99=%.2f mean=%.2f\n", n, us[n / 2], us[n * 9 / 10], us[n * 99 / 100], sum / n);
	return 0;
}
