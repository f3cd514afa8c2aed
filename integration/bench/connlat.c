/*
 * connlat: the latency of connect(2) to a local listener, N times, for
 * preload.sh to run with and without the preload shim. Each connect is a
 * blocking TCP connect to 127.0.0.1 timed with CLOCK_MONOTONIC; the
 * connection is then reset (SO_LINGER 0) so no TIME_WAIT piles up. A thread
 * accepts and closes. Prints: n, median, p90, p99 and mean, in
 * microseconds.
 *
 * usage: connlat [N]      (default 10000)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

int main(int argc, char **argv)
{
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
