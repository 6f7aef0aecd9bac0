/* The TCP bootstrap of zero_nccl.h, built without CUDA or NCCL (ZERO_NCCL_BOOTSTRAP_ONLY):
   launcher environments (torchrun, OpenMPI, Slurm, precedence, bad values), the exchange
   of 128 random bytes between 2..8 forked processes on loopback (rank 0 on an ephemeral
   port, rank 0 starting late), and the failure paths: port in use, a peer that never
   arrives, rank 0 never coming, malformed messages from fake peers on either side, a rank
   claimed twice, stray connections. Children end with _exit() and are reaped with a
   deadline (stragglers are killed), so the test can neither hang nor leave processes. */
#define _POSIX_C_SOURCE 200809L /* the implementation (build/zero_impl.o) is linked in */
#include "zero.h"
#define ZERO_NCCL_BOOTSTRAP_ONLY
#include "zero_nccl.h"
#include "tests/zt.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define ID_BYTES 128
#define MAX_CHILDREN 16

/* ---- helpers ---- */

static int contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

static void random_id(unsigned char *id, size_t n, unsigned long long seed)
{
    size_t i;
    zt_seed(seed);
    for (i = 0; i < n; i++) id[i] = (unsigned char)(zt_rand64() >> 56);
}

/* "localhost" when the resolver knows it (almost always), else the numeric address. */
static const char *g_name = "127.0.0.1";

static void pick_name(void)
{
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo("localhost", "80", &hints, &res) == 0) {
        g_name = "localhost";
        freeaddrinfo(res);
    }
}

static zero_bootstrap_desc make_desc(int rank, int world, int port, int timeout_ms)
{
    zero_bootstrap_desc d;
    memset(&d, 0, sizeof d);
    d.rank = rank;
    d.world = world;
    d.local_rank = rank;
    d.local_world = world;
    d.port = port;
    d.timeout_ms = timeout_ms;
    /* odd ranks go through the resolver ("localhost" may be ::1 or 127.0.0.1) */
    snprintf(d.addr, sizeof d.addr, "%s", rank % 2 ? g_name : "127.0.0.1");
    return d;
}

/* A port nobody listens on (bound to 0, read, closed). */
static int free_port(void)
{
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = -1;
    if (fd < 0) return -1;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = 0;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/* A plain listening IPv4 socket on an ephemeral port (a fake rank 0 or a blocker). */
static int raw_listener(int *port)
{
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 16) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        close(fd);
        return -1;
    }
    *port = ntohs(a.sin_port);
    return fd;
}

static int raw_connect(int port)
{
    struct sockaddr_in a;
    int fd, tries;
    for (tries = 0; tries < 200; tries++) {
        fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0) return -1;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons((unsigned short)port);
        if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) return fd;
        close(fd);
        zt_sleep_ms(10);
    }
    return -1;
}

static void put32(unsigned char *p, unsigned v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static unsigned fnv1a(const void *data, size_t n)
{
    const unsigned char *p = (const unsigned char *)data;
    unsigned h = 2166136261u;
    size_t i;
    for (i = 0; i < n; i++) {
        h ^= p[i];
        h *= 16777619u;
    }
    return h;
}

/* A header as the protocol spells it (see zero_nccl.h: magic "ZER0", version 1). */
static void header(unsigned char *out, unsigned magic, unsigned version, unsigned type,
                   unsigned world, unsigned rank, unsigned id_bytes, unsigned payload,
                   unsigned checksum, int status)
{
    put32(out, magic);
    out[4] = (unsigned char)(version >> 8);
    out[5] = (unsigned char)version;
    out[6] = (unsigned char)(type >> 8);
    out[7] = (unsigned char)type;
    put32(out + 8, world);
    put32(out + 12, rank);
    put32(out + 16, id_bytes);
    put32(out + 20, payload);
    put32(out + 24, checksum);
    put32(out + 28, (unsigned)status);
}

#define MAGIC 0x5A455230u
enum { T_HELLO = 1, T_ID = 2, T_ACK = 3, T_ERROR = 4 };

static int send_bytes(int fd, const void *p, size_t n)
{
    return send(fd, p, n, MSG_NOSIGNAL) == (ssize_t)n ? 0 : -1;
}

/* Reads up to n bytes, waiting at most ms in total. */
static size_t recv_some(int fd, void *buf, size_t n, int ms)
{
    size_t got = 0;
    double end = zt_now_ms() + ms;
    while (got < n && zt_now_ms() < end) {
        struct pollfd pfd;
        ssize_t r;
        pfd.fd = fd;
        pfd.events = POLLIN;
        pfd.revents = 0;
        if (poll(&pfd, 1, 20) <= 0) continue;
        r = recv(fd, (char *)buf + got, n - got, 0);
        if (r <= 0) break;
        got += (size_t)r;
    }
    return got;
}

/* ---- children ---- */

typedef int (*child_fn)(void *arg);

/* Runs fn in a child that ends with _exit(fn(arg)); a SIGALRM safety net ends it if it
   ever blocks for more than 30 s. */
static pid_t spawn(child_fn fn, void *arg)
{
    pid_t pid;
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid == 0) {
        alarm(30);
        _exit(fn(arg));
    }
    return pid;
}

/* Reaps children, waiting at most deadline_ms; kills and reaps stragglers. codes[i] is the
   exit status, or -signal, or -100 for a straggler. Returns how many did not exit 0. */
static int reap(const pid_t *pids, int n, int deadline_ms, int *codes)
{
    int done[MAX_CHILDREN] = {0}, left = n, i, bad = 0;
    double end = zt_now_ms() + deadline_ms;
    for (i = 0; i < n; i++) {
        codes[i] = -100;
        if (pids[i] <= 0) {
            done[i] = 1;
            left--;
            codes[i] = -101;
        }
    }
    while (left > 0 && zt_now_ms() < end) {
        for (i = 0; i < n; i++) {
            int st = 0;
            pid_t w;
            if (done[i]) continue;
            w = waitpid(pids[i], &st, WNOHANG);
            if (w == pids[i] || (w < 0 && errno == ECHILD)) {
                done[i] = 1;
                left--;
                codes[i] = w < 0 ? -102 : WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
            }
        }
        if (left > 0) zt_sleep_ms(5);
    }
    for (i = 0; i < n; i++) {
        if (!done[i]) { /* straggler: kill, then reap (prompt after SIGKILL) */
            int st;
            kill(pids[i], SIGKILL);
            waitpid(pids[i], &st, 0);
            codes[i] = -100;
        }
        if (codes[i] != 0) bad++;
    }
    return bad;
}

/* Exit codes of the client children. */
enum { C_OK = 0, C_WRONG_BYTES = 1, C_UNEXPECTED = 2, C_ERR_BASE = 10 };

typedef struct client_arg {
    zero_bootstrap_desc desc;
    unsigned char expect[ID_BYTES];
    zero_result want; /* the result the child expects */
    int repeat;       /* call exchange this many times, expecting OK then 'want' */
} client_arg;

static int client_child(void *p)
{
    client_arg *a = (client_arg *)p;
    unsigned char got[ID_BYTES];
    int i, calls = a->repeat > 0 ? a->repeat : 1;
    for (i = 0; i < calls; i++) {
        zero_result want = (i + 1 < calls) ? ZERO_OK : a->want;
        zero_result r;
        memset(got, 0, sizeof got);
        r = zero_bootstrap_exchange(&a->desc, got, sizeof got);
        if (r != want) {
            fprintf(stderr, "  child rank %d: got %s, wanted %s: %s\n", a->desc.rank,
                    zero_result_string(r), zero_result_string(want), zero_last_error());
            return r < 0 ? C_ERR_BASE - (int)r : C_UNEXPECTED;
        }
        if (r == ZERO_OK && memcmp(got, a->expect, sizeof got) != 0) {
            fprintf(stderr, "  child rank %d: received bytes differ from rank 0's\n", a->desc.rank);
            return C_WRONG_BYTES;
        }
    }
    return C_OK;
}

typedef struct server_arg {
    zero_bootstrap_server *server;
    unsigned char id[ID_BYTES];
} server_arg;

static int server_child(void *p)
{
    server_arg *a = (server_arg *)p;
    zero_result r = zero_bootstrap_serve(a->server, a->id, sizeof a->id);
    if (r != ZERO_OK) {
        fprintf(stderr, "  rank 0: %s: %s\n", zero_result_string(r), zero_last_error());
        return C_ERR_BASE - (int)r;
    }
    return C_OK;
}

/* ---- environment ---- */

typedef struct fake_env {
    const char *vars[40]; /* "NAME=value", NULL-terminated */
} fake_env;

static const char *fake_get(const char *name, void *user)
{
    const fake_env *e = (const fake_env *)user;
    size_t n = strlen(name);
    int i;
    for (i = 0; e->vars[i]; i++)
        if (strncmp(e->vars[i], name, n) == 0 && e->vars[i][n] == '=') return e->vars[i] + n + 1;
    return NULL;
}

static zero_result env_of(zero_bootstrap_desc *d, const char *a, const char *b, const char *c,
                          const char *dd, const char *e, const char *f, const char *g,
                          const char *h)
{
    fake_env env;
    memset(&env, 0, sizeof env);
    env.vars[0] = a;
    env.vars[1] = b;
    env.vars[2] = c;
    env.vars[3] = dd;
    env.vars[4] = e;
    env.vars[5] = f;
    env.vars[6] = g;
    env.vars[7] = h;
    /* NULLs end the list early: pack the given entries */
    {
        int i, k = 0;
        const char *packed[8];
        for (i = 0; i < 8; i++)
            if (env.vars[i]) packed[k++] = env.vars[i];
        for (i = 0; i < 8; i++) env.vars[i] = i < k ? packed[i] : NULL;
    }
    return zero_bootstrap_env_from(fake_get, &env, d);
}

#define N_ NULL

ZT_TEST(env_none)
{
    zero_bootstrap_desc d;
    ZT_CHECK(env_of(&d, N_, N_, N_, N_, N_, N_, N_, N_) == ZERO_OK);
    ZT_CHECK(d.launcher == ZERO_LAUNCHER_NONE && d.rank == 0 && d.world == 1);
    ZT_CHECK(d.local_rank == 0 && d.local_world == 1);
    ZT_CHECK(strcmp(d.addr, "127.0.0.1") == 0);
    ZT_CHECK(d.port == ZERO_BOOTSTRAP_DEFAULT_PORT);
    ZT_CHECK(d.timeout_ms == ZERO_BOOTSTRAP_DEFAULT_TIMEOUT_MS);
    ZT_CHECK(strcmp(zero_launcher_name(d.launcher), "none") == 0);
}

ZT_TEST(env_torchrun)
{
    zero_bootstrap_desc d;
    ZT_CHECK(env_of(&d, "RANK=5", "WORLD_SIZE=16", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=8",
                    "MASTER_ADDR=node-a.cluster", "MASTER_PORT=29400", N_, N_) == ZERO_OK);
    ZT_CHECK(d.launcher == ZERO_LAUNCHER_TORCHRUN);
    ZT_CHECK(d.rank == 5 && d.world == 16 && d.local_rank == 1 && d.local_world == 8);
    ZT_CHECK(strcmp(d.addr, "node-a.cluster") == 0);
    ZT_CHECK(d.port == 29400);
    /* torchrun's agent store already listens on MASTER_PORT */
    ZT_CHECK(env_of(&d, "RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=29400",
                    "TORCHELASTIC_USE_AGENT_STORE=True", N_, N_, N_) == ZERO_OK);
    ZT_CHECK(d.port == 29401);
    ZT_CHECK(env_of(&d, "RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=29400",
                    "TORCHELASTIC_USE_AGENT_STORE=False", N_, N_, N_) == ZERO_OK);
    ZT_CHECK(d.port == 29400);
    /* ZERO_BOOTSTRAP_PORT wins; the timeout comes from its variable */
    ZT_CHECK(env_of(&d, "RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=29400",
                    "TORCHELASTIC_USE_AGENT_STORE=True", "ZERO_BOOTSTRAP_PORT=31000",
                    "ZERO_BOOTSTRAP_TIMEOUT_MS=1234", N_) == ZERO_OK);
    ZT_CHECK(d.port == 31000 && d.timeout_ms == 1234);
    /* by hand on one node: no MASTER_ADDR needed when every rank is local */
    ZT_CHECK(env_of(&d, "RANK=1", "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=2", N_, N_, N_, N_, N_) ==
             ZERO_OK);
    ZT_CHECK(strcmp(d.addr, "127.0.0.1") == 0 && d.port == ZERO_BOOTSTRAP_DEFAULT_PORT);
    ZT_CHECK(d.local_rank == -1); /* LOCAL_RANK not given */
}

ZT_TEST(env_openmpi)
{
    zero_bootstrap_desc d;
    ZT_CHECK(env_of(&d, "OMPI_COMM_WORLD_RANK=3", "OMPI_COMM_WORLD_SIZE=4",
                    "OMPI_COMM_WORLD_LOCAL_RANK=3", "OMPI_COMM_WORLD_LOCAL_SIZE=4", N_, N_, N_,
                    N_) == ZERO_OK);
    ZT_CHECK(d.launcher == ZERO_LAUNCHER_OPENMPI);
    ZT_CHECK(d.rank == 3 && d.world == 4 && d.local_rank == 3 && d.local_world == 4);
    ZT_CHECK(strcmp(d.addr, "127.0.0.1") == 0); /* one node */
    /* several nodes: MASTER_ADDR is required, and the message says how to pass it */
    ZT_CHECK(env_of(&d, "OMPI_COMM_WORLD_RANK=3", "OMPI_COMM_WORLD_SIZE=16",
                    "OMPI_COMM_WORLD_LOCAL_RANK=3", "OMPI_COMM_WORLD_LOCAL_SIZE=8", N_, N_, N_,
                    N_) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECKF(contains(zero_last_error(), "MASTER_ADDR") && contains(zero_last_error(), "mpirun -x"),
              "%s", zero_last_error());
    ZT_CHECK(env_of(&d, "OMPI_COMM_WORLD_RANK=3", "OMPI_COMM_WORLD_SIZE=16",
                    "OMPI_COMM_WORLD_LOCAL_RANK=3", "OMPI_COMM_WORLD_LOCAL_SIZE=8",
                    "MASTER_ADDR=10.0.0.7", "MASTER_PORT=4000", N_, N_) == ZERO_OK);
    ZT_CHECK(strcmp(d.addr, "10.0.0.7") == 0 && d.port == 4000);
}

ZT_TEST(env_slurm)
{
    zero_bootstrap_desc d;
    ZT_CHECK(env_of(&d, "SLURM_PROCID=9", "SLURM_NTASKS=16", "SLURM_LOCALID=1",
                    "SLURM_JOB_NODELIST=gpu[007-010,012],cpu1", "SLURM_JOB_ID=123456", N_, N_,
                    N_) == ZERO_OK);
    ZT_CHECK(d.launcher == ZERO_LAUNCHER_SLURM);
    ZT_CHECK(d.rank == 9 && d.world == 16 && d.local_rank == 1);
    ZT_CHECKF(strcmp(d.addr, "gpu007") == 0, "addr %s", d.addr);
    ZT_CHECK(d.port == 20000 + 123456 % 10000);
    /* the step's values win over the job's */
    ZT_CHECK(env_of(&d, "SLURM_PROCID=2", "SLURM_NTASKS=64", "SLURM_STEP_NUM_TASKS=4",
                    "SLURM_JOB_NODELIST=a[1-8]", "SLURM_STEP_NODELIST=rack[3-4]-n[01-02]",
                    "MASTER_PORT=5000", N_, N_) == ZERO_OK);
    ZT_CHECK(d.world == 4);
    ZT_CHECKF(strcmp(d.addr, "rack3-n01") == 0, "addr %s", d.addr);
    ZT_CHECK(d.port == 5000);
    ZT_CHECK(env_of(&d, "SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_NODELIST=solo", N_, N_, N_,
                    N_, N_) == ZERO_OK);
    ZT_CHECK(strcmp(d.addr, "solo") == 0 && d.port == ZERO_BOOTSTRAP_DEFAULT_PORT);
    ZT_CHECK(env_of(&d, "SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_NNODES=1", N_, N_, N_, N_,
                    N_) == ZERO_OK);
    ZT_CHECK(strcmp(d.addr, "127.0.0.1") == 0 && d.local_world == 2);
    /* MASTER_ADDR wins over the node list */
    ZT_CHECK(env_of(&d, "SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_NODELIST=a[1-2]",
                    "MASTER_ADDR=b", N_, N_, N_, N_) == ZERO_OK);
    ZT_CHECK(strcmp(d.addr, "b") == 0);
    /* malformed node lists */
    ZT_CHECK(env_of(&d, "SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_NODELIST=a[1-2", N_, N_, N_,
                    N_, N_) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(env_of(&d, "SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_NODELIST=", N_, N_, N_, N_,
                    N_) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(env_of(&d, "SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_NODELIST=[]", N_, N_, N_, N_,
                    N_) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(contains(zero_last_error(), "MASTER_ADDR"));
}

ZT_TEST(env_precedence)
{
    zero_bootstrap_desc d;
    /* torchrun inside a Slurm job, under mpirun's variables too: torchrun's win */
    ZT_CHECK(env_of(&d, "SLURM_PROCID=0", "SLURM_NTASKS=2", "OMPI_COMM_WORLD_RANK=0",
                    "OMPI_COMM_WORLD_SIZE=2", "RANK=3", "WORLD_SIZE=4", "MASTER_ADDR=x",
                    N_) == ZERO_OK);
    ZT_CHECK(d.launcher == ZERO_LAUNCHER_TORCHRUN && d.rank == 3 && d.world == 4);
    /* mpirun inside a Slurm job: OpenMPI's win */
    ZT_CHECK(env_of(&d, "SLURM_PROCID=1", "SLURM_NTASKS=2", "SLURM_NODELIST=n[1-2]",
                    "OMPI_COMM_WORLD_RANK=5", "OMPI_COMM_WORLD_SIZE=8", "MASTER_ADDR=x", N_,
                    N_) == ZERO_OK);
    ZT_CHECK(d.launcher == ZERO_LAUNCHER_OPENMPI && d.rank == 5 && d.world == 8);
    ZT_CHECK(strcmp(d.addr, "x") == 0);
}

ZT_TEST(env_errors)
{
    zero_bootstrap_desc d, before;
    memset(&d, 0x5a, sizeof d);
    before = d;
    ZT_CHECK(env_of(&d, "RANK=abc", "WORLD_SIZE=2", N_, N_, N_, N_, N_, N_) ==
             ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECKF(contains(zero_last_error(), "RANK") && contains(zero_last_error(), "abc"), "%s",
              zero_last_error());
    ZT_CHECK(memcmp(&d, &before, sizeof d) == 0); /* untouched on error */
    ZT_CHECK(env_of(&d, "RANK=1", N_, N_, N_, N_, N_, N_, N_) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(contains(zero_last_error(), "WORLD_SIZE"));
    ZT_CHECK(env_of(&d, "WORLD_SIZE=4", N_, N_, N_, N_, N_, N_, N_) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(env_of(&d, "RANK=4", "WORLD_SIZE=4", N_, N_, N_, N_, N_, N_) ==
             ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(env_of(&d, "RANK=-1", "WORLD_SIZE=4", N_, N_, N_, N_, N_, N_) ==
             ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(env_of(&d, "RANK=0", "WORLD_SIZE=0", N_, N_, N_, N_, N_, N_) ==
             ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(env_of(&d, "RANK=", "WORLD_SIZE=2", N_, N_, N_, N_, N_, N_) ==
             ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(contains(zero_last_error(), "empty"));
    ZT_CHECK(env_of(&d, "RANK=1x", "WORLD_SIZE=2", N_, N_, N_, N_, N_, N_) ==
             ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(env_of(&d, "RANK= 1", "WORLD_SIZE=2", N_, N_, N_, N_, N_, N_) ==
             ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(env_of(&d, "RANK=0", "WORLD_SIZE=99999999999999999999999", N_, N_, N_, N_, N_, N_) ==
             ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(env_of(&d, "RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=-3", N_, N_, N_, N_, N_) ==
             ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(env_of(&d, "RANK=0", "WORLD_SIZE=4", "LOCAL_WORLD_SIZE=2", "LOCAL_RANK=2", N_, N_,
                    N_, N_) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(env_of(&d, "RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=70000", N_, N_,
                    N_, N_) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(contains(zero_last_error(), "MASTER_PORT"));
    ZT_CHECK(env_of(&d, "RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=0", N_, N_, N_,
                    N_) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(env_of(&d, "RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=65535",
                    "TORCHELASTIC_USE_AGENT_STORE=True", N_, N_, N_) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(env_of(&d, "RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=", N_, N_, N_, N_, N_) ==
             ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(env_of(&d, "RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=h", "ZERO_BOOTSTRAP_TIMEOUT_MS=0",
                    N_, N_, N_, N_) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(env_of(&d, "RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=h", "ZERO_BOOTSTRAP_PORT=port",
                    N_, N_, N_, N_) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(env_of(&d, "OMPI_COMM_WORLD_RANK=0", N_, N_, N_, N_, N_, N_, N_) ==
             ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(contains(zero_last_error(), "OMPI_COMM_WORLD_SIZE"));
    ZT_CHECK(env_of(&d, "SLURM_PROCID=0", N_, N_, N_, N_, N_, N_, N_) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(env_of(&d, "SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_NODELIST=n1",
                    "SLURM_JOB_ID=job", N_, N_, N_, N_) == ZERO_ERROR_INVALID_ARGUMENT);
    {
        static char long_addr[400];
        memset(long_addr, 'a', sizeof long_addr - 1);
        memcpy(long_addr, "MASTER_ADDR=", 12);
        long_addr[sizeof long_addr - 1] = '\0';
        ZT_CHECK(env_of(&d, "RANK=0", "WORLD_SIZE=2", long_addr, N_, N_, N_, N_, N_) ==
                 ZERO_ERROR_INVALID_ARGUMENT);
    }
    ZT_CHECK(zero_bootstrap_env_from(fake_get, NULL, NULL) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_bootstrap_env_from(NULL, NULL, &d) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_bootstrap_env(NULL) == ZERO_ERROR_INVALID_ARGUMENT);
}

/* zero_bootstrap_env() reads the real environment (the launcher's variables of the CI
   machine itself, if any, are saved and restored). */
ZT_TEST(env_process)
{
    static const char *names[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                  "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE",
                                  "ZERO_BOOTSTRAP_PORT", "ZERO_BOOTSTRAP_TIMEOUT_MS",
                                  "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                  "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
                                  "SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS",
                                  "SLURM_NPROCS", "SLURM_LOCALID", "SLURM_STEP_NODELIST",
                                  "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_JOB_ID",
                                  "SLURM_NNODES", "SLURM_STEP_NUM_NODES"};
    enum { NV = sizeof names / sizeof names[0] };
    char *saved[NV];
    zero_bootstrap_desc d;
    int i;
    for (i = 0; i < NV; i++) {
        const char *v = getenv(names[i]);
        saved[i] = NULL;
        if (v) {
            saved[i] = (char *)malloc(strlen(v) + 1);
            if (saved[i]) memcpy(saved[i], v, strlen(v) + 1);
        }
        unsetenv(names[i]);
    }
    ZT_CHECK(zero_bootstrap_env(&d) == ZERO_OK && d.world == 1 && d.rank == 0);
    setenv("RANK", "2", 1);
    setenv("WORLD_SIZE", "3", 1);
    setenv("LOCAL_RANK", "2", 1);
    setenv("MASTER_ADDR", "10.1.2.3", 1);
    setenv("MASTER_PORT", "12345", 1);
    ZT_CHECK(zero_bootstrap_env(&d) == ZERO_OK);
    ZT_CHECK(d.launcher == ZERO_LAUNCHER_TORCHRUN && d.rank == 2 && d.world == 3 &&
             d.local_rank == 2 && d.port == 12345 && strcmp(d.addr, "10.1.2.3") == 0);
    for (i = 0; i < NV; i++) {
        unsetenv(names[i]);
        if (saved[i]) setenv(names[i], saved[i], 1);
        free(saved[i]);
    }
}

/* ---- argument checks ---- */

ZT_TEST(exchange_arguments)
{
    unsigned char id[ID_BYTES];
    zero_bootstrap_desc d = make_desc(1, 2, 29500, 100);
    zero_bootstrap_server *s = NULL;
    ZT_CHECK(zero_bootstrap_exchange(NULL, id, sizeof id) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_bootstrap_exchange(&d, NULL, sizeof id) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_bootstrap_exchange(&d, id, 0) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_bootstrap_exchange(&d, id, ZERO_BOOTSTRAP_MAX_ID_BYTES + 1) ==
             ZERO_ERROR_INVALID_ARGUMENT);
    d = make_desc(0, 0, 29500, 100);
    ZT_CHECK(zero_bootstrap_exchange(&d, id, sizeof id) == ZERO_ERROR_INVALID_ARGUMENT);
    d = make_desc(2, 2, 29500, 100);
    ZT_CHECK(zero_bootstrap_exchange(&d, id, sizeof id) == ZERO_ERROR_INVALID_ARGUMENT);
    d = make_desc(-1, 2, 29500, 100);
    ZT_CHECK(zero_bootstrap_exchange(&d, id, sizeof id) == ZERO_ERROR_INVALID_ARGUMENT);
    d = make_desc(1, 2, 0, 100); /* a client cannot connect to port 0 */
    ZT_CHECK(zero_bootstrap_exchange(&d, id, sizeof id) == ZERO_ERROR_INVALID_ARGUMENT);
    d = make_desc(0, 2, 0, 100); /* nor can rank 0 serve on a port nobody knows */
    ZT_CHECK(zero_bootstrap_exchange(&d, id, sizeof id) == ZERO_ERROR_INVALID_ARGUMENT);
    d = make_desc(1, 2, 70000, 100);
    ZT_CHECK(zero_bootstrap_exchange(&d, id, sizeof id) == ZERO_ERROR_INVALID_ARGUMENT);
    d = make_desc(1, 2, 29500, -5);
    ZT_CHECK(zero_bootstrap_exchange(&d, id, sizeof id) == ZERO_ERROR_INVALID_ARGUMENT);
    d = make_desc(1, 2, 29500, 100);
    d.addr[0] = '\0';
    ZT_CHECK(zero_bootstrap_exchange(&d, id, sizeof id) == ZERO_ERROR_INVALID_ARGUMENT);
    d = make_desc(0, 1, 29500, 100); /* world 1: nothing to do, no network */
    memset(id, 7, sizeof id);
    ZT_CHECK(zero_bootstrap_exchange(&d, id, sizeof id) == ZERO_OK && id[0] == 7);
    d = make_desc(1, 2, 0, 100);
    ZT_CHECK(zero_bootstrap_listen(&d, &s) == ZERO_ERROR_INVALID_ARGUMENT && s == NULL);
    ZT_CHECK(zero_bootstrap_listen(NULL, &s) == ZERO_ERROR_INVALID_ARGUMENT);
    d = make_desc(0, 2, 0, 100);
    ZT_CHECK(zero_bootstrap_listen(&d, NULL) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_bootstrap_serve(NULL, id, sizeof id) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_bootstrap_server_port(NULL) == -1);
    zero_bootstrap_server_close(NULL);
    ZT_CHECK(zero_bootstrap_listen(&d, &s) == ZERO_OK && s != NULL);
    if (s) {
        ZT_CHECK(zero_bootstrap_server_port(s) > 0);
        ZT_CHECK(zero_bootstrap_serve(s, NULL, sizeof id) == ZERO_ERROR_INVALID_ARGUMENT);
        ZT_CHECK(zero_bootstrap_serve(s, id, 0) == ZERO_ERROR_INVALID_ARGUMENT);
        zero_bootstrap_server_close(s);
    }
}

/* ---- the exchange between processes ---- */

static void run_exchange(int world)
{
    client_arg args[MAX_CHILDREN];
    server_arg sa;
    pid_t pids[MAX_CHILDREN];
    int codes[MAX_CHILDREN], r, bad;
    zero_bootstrap_desc d0 = make_desc(0, world, 0, 15000);
    zero_bootstrap_server *s = NULL;

    ZT_CHECK(zero_bootstrap_listen(&d0, &s) == ZERO_OK);
    if (!s) return;
    random_id(sa.id, ID_BYTES, 1000u + (unsigned)world);
    sa.server = s;
    pids[0] = spawn(server_child, &sa);
    for (r = 1; r < world; r++) {
        args[r].desc = make_desc(r, world, zero_bootstrap_server_port(s), 15000);
        memcpy(args[r].expect, sa.id, ID_BYTES);
        args[r].want = ZERO_OK;
        args[r].repeat = 1;
        pids[r] = spawn(client_child, &args[r]);
    }
    zero_bootstrap_server_close(s); /* rank 0's child holds its own copy */
    bad = reap(pids, world, 30000, codes);
    ZT_CHECKF(bad == 0, "world %d: %d processes failed (rank 0 exit %d, rank 1 exit %d)", world,
              bad, codes[0], codes[1]);
}

ZT_TEST(exchange_2_to_8_processes)
{
    int world;
    for (world = 2; world <= 8; world++) run_exchange(world);
}

/* Rank 0 starts 300 ms after the others: they retry connecting until it is up. */
ZT_TEST(exchange_rank0_late)
{
    client_arg args[4];
    pid_t pids[4];
    int codes[4], r, port = free_port();
    unsigned char id[ID_BYTES];
    zero_bootstrap_desc d0;
    zero_result res;
    ZT_CHECK(port > 0);
    if (port <= 0) return;
    random_id(id, sizeof id, 77);
    for (r = 1; r < 4; r++) {
        args[r].desc = make_desc(r, 4, port, 15000);
        memcpy(args[r].expect, id, ID_BYTES);
        args[r].want = ZERO_OK;
        args[r].repeat = 1;
        pids[r - 1] = spawn(client_child, &args[r]);
    }
    zt_sleep_ms(300);
    d0 = make_desc(0, 4, port, 15000);
    res = zero_bootstrap_exchange(&d0, id, sizeof id);
    ZT_CHECKF(res == ZERO_OK, "%s: %s", zero_result_string(res), zero_last_error());
    ZT_CHECK(reap(pids, 3, 30000, codes) == 0);
}

/* ---- failure paths ---- */

ZT_TEST(port_in_use)
{
    int port = 0, blocker = raw_listener(&port);
    unsigned char id[ID_BYTES];
    zero_bootstrap_desc d;
    zero_bootstrap_server *s = NULL;
    double t0;
    zero_result r;
    ZT_CHECK(blocker >= 0);
    if (blocker < 0) return;
    memset(id, 1, sizeof id);
    d = make_desc(0, 2, port, 5000);
    t0 = zt_now_ms();
    r = zero_bootstrap_exchange(&d, id, sizeof id);
    ZT_CHECKF(r == ZERO_ERROR_IO, "%s", zero_result_string(r));
    ZT_CHECKF(contains(zero_last_error(), "in use") && contains(zero_last_error(), "MASTER_PORT"),
              "%s", zero_last_error());
    ZT_CHECK(zt_now_ms() - t0 < 1000); /* at once, not at the timeout */
    ZT_CHECK(zero_bootstrap_listen(&d, &s) == ZERO_ERROR_IO && s == NULL);
    close(blocker);
}

/* World 3, rank 2 never comes: rank 0 gives up at its 300 ms deadline and names rank 2;
   rank 1, which came, got the id. */
ZT_TEST(peer_never_arrives)
{
    client_arg a;
    pid_t pid;
    int code;
    unsigned char id[ID_BYTES];
    zero_bootstrap_desc d0 = make_desc(0, 3, 0, 300);
    zero_bootstrap_server *s = NULL;
    double t0, dt;
    zero_result r;
    ZT_CHECK(zero_bootstrap_listen(&d0, &s) == ZERO_OK);
    if (!s) return;
    random_id(id, sizeof id, 5);
    a.desc = make_desc(1, 3, zero_bootstrap_server_port(s), 5000);
    memcpy(a.expect, id, ID_BYTES);
    a.want = ZERO_OK;
    a.repeat = 1;
    pid = spawn(client_child, &a);
    t0 = zt_now_ms();
    r = zero_bootstrap_serve(s, id, sizeof id);
    dt = zt_now_ms() - t0;
    zero_bootstrap_server_close(s);
    ZT_CHECKF(r == ZERO_ERROR_TIMEOUT, "%s", zero_result_string(r));
    ZT_CHECKF(contains(zero_last_error(), "rank(s) 2 never got the id"), "%s", zero_last_error());
    ZT_CHECKF(dt >= 250 && dt < 2000, "took %.0f ms for a 300 ms deadline", dt);
    ZT_CHECK(reap(&pid, 1, 10000, &code) == 0);
}

ZT_TEST(rank0_never_comes)
{
    unsigned char id[ID_BYTES];
    int port = free_port();
    zero_bootstrap_desc d = make_desc(1, 2, port, 300);
    double t0, dt;
    zero_result r;
    memset(id, 9, sizeof id);
    t0 = zt_now_ms();
    r = zero_bootstrap_exchange(&d, id, sizeof id);
    dt = zt_now_ms() - t0;
    ZT_CHECKF(r == ZERO_ERROR_TIMEOUT, "%s", zero_result_string(r));
    ZT_CHECKF(contains(zero_last_error(), "could not get the id"), "%s", zero_last_error());
    ZT_CHECKF(dt >= 250 && dt < 2000, "took %.0f ms for a 300 ms deadline", dt);
    ZT_CHECK(id[0] == 9 && id[ID_BYTES - 1] == 9); /* untouched */
}

/* Fake clients: each child connects to rank 0 and sends 'bytes'; rank 0 must fail at once
   with 'want' and a message containing 'says'. */
typedef struct fake_client_arg {
    int port;
    unsigned char bytes[64];
    size_t n;
    int read_id_first; /* send a valid hello, read the id frame, then send 'bytes' */
} fake_client_arg;

static int fake_client(void *p)
{
    fake_client_arg *a = (fake_client_arg *)p;
    unsigned char buf[512];
    int fd = raw_connect(a->port);
    if (fd < 0) return 3;
    if (a->read_id_first) {
        unsigned char hello[32];
        header(hello, MAGIC, 1, T_HELLO, 2, 1, ID_BYTES, 0, fnv1a(NULL, 0), 0);
        if (send_bytes(fd, hello, sizeof hello) != 0) return 4;
        if (recv_some(fd, buf, 32 + ID_BYTES, 3000) != 32 + ID_BYTES) return 5;
    }
    if (send_bytes(fd, a->bytes, a->n) != 0) return 6;
    (void)recv_some(fd, buf, sizeof buf, 1000); /* rank 0's error frame, if any */
    close(fd);
    return 0;
}

static void expect_server_rejects(const unsigned char *bytes, size_t n, int read_id_first,
                                  zero_result want, const char *says)
{
    fake_client_arg a;
    pid_t pid;
    int code;
    unsigned char id[ID_BYTES];
    zero_bootstrap_desc d0 = make_desc(0, 2, 0, 5000);
    zero_bootstrap_server *s = NULL;
    double t0, dt;
    zero_result r;
    ZT_CHECK(zero_bootstrap_listen(&d0, &s) == ZERO_OK);
    if (!s) return;
    memset(&a, 0, sizeof a);
    a.port = zero_bootstrap_server_port(s);
    memcpy(a.bytes, bytes, n);
    a.n = n;
    a.read_id_first = read_id_first;
    memset(id, 3, sizeof id);
    pid = spawn(fake_client, &a);
    t0 = zt_now_ms();
    r = zero_bootstrap_serve(s, id, sizeof id);
    dt = zt_now_ms() - t0;
    zero_bootstrap_server_close(s);
    ZT_CHECKF(r == want, "got %s, wanted %s (%s)", zero_result_string(r), zero_result_string(want),
              zero_last_error());
    ZT_CHECKF(contains(zero_last_error(), says), "message lacks \"%s\": %s", says, zero_last_error());
    ZT_CHECKF(dt < 3000, "took %.0f ms: should fail at once, not at the deadline", dt);
    ZT_CHECK(reap(&pid, 1, 10000, &code) == 0);
}

ZT_TEST(malformed_from_client)
{
    unsigned char m[32];
    memset(m, 0xab, sizeof m); /* garbage */
    expect_server_rejects(m, sizeof m, 0, ZERO_ERROR_COMM, "magic");
    memcpy(m, "GET / HTTP/1.1\r\nHost: x\r\n\r\n.....", 32); /* another protocol */
    expect_server_rejects(m, sizeof m, 0, ZERO_ERROR_COMM, "magic");
    header(m, MAGIC, 99, T_HELLO, 2, 1, ID_BYTES, 0, fnv1a(NULL, 0), 0);
    expect_server_rejects(m, sizeof m, 0, ZERO_ERROR_COMM, "protocol");
    header(m, MAGIC, 1, T_HELLO, 3, 1, ID_BYTES, 0, fnv1a(NULL, 0), 0);
    expect_server_rejects(m, sizeof m, 0, ZERO_ERROR_MISMATCH, "world size");
    header(m, MAGIC, 1, T_HELLO, 2, 1, 64, 0, fnv1a(NULL, 0), 0);
    expect_server_rejects(m, sizeof m, 0, ZERO_ERROR_COMM, "id of 64 bytes");
    header(m, MAGIC, 1, T_ACK, 2, 1, ID_BYTES, 0, fnv1a(NULL, 0), 0);
    expect_server_rejects(m, sizeof m, 0, ZERO_ERROR_COMM, "hello was expected");
    header(m, MAGIC, 1, T_HELLO, 2, 1, ID_BYTES, 100, 0, 0);
    expect_server_rejects(m, sizeof m, 0, ZERO_ERROR_COMM, "hello was expected");
    header(m, MAGIC, 1, T_HELLO, 2, 7, ID_BYTES, 0, fnv1a(NULL, 0), 0);
    expect_server_rejects(m, sizeof m, 0, ZERO_ERROR_MISMATCH, "claims rank 7");
    header(m, MAGIC, 1, T_HELLO, 2, 0, ID_BYTES, 0, fnv1a(NULL, 0), 0);
    expect_server_rejects(m, sizeof m, 0, ZERO_ERROR_MISMATCH, "claims rank 0");
    memset(m, 0x11, sizeof m); /* a valid hello, then a garbage ack */
    expect_server_rejects(m, sizeof m, 1, ZERO_ERROR_COMM, "magic");
    header(m, MAGIC, 1, T_ACK, 2, 1, ID_BYTES, 5, 0, 0); /* ack with a payload */
    expect_server_rejects(m, sizeof m, 1, ZERO_ERROR_COMM, "ack was expected");
}

/* Fake rank 0: accepts one connection, reads the hello, answers 'bytes', closes. */
typedef struct fake_server_arg {
    int fd;
    unsigned char bytes[32 + ID_BYTES + 64];
    size_t n;
    int hold_ms; /* how long to keep the connection open after answering; 0 = 100 */
} fake_server_arg;

static int fake_server(void *p)
{
    fake_server_arg *a = (fake_server_arg *)p;
    unsigned char hello[32];
    int c = accept(a->fd, NULL, NULL);
    if (c < 0) return 3;
    if (recv_some(c, hello, sizeof hello, 3000) != sizeof hello) return 4;
    if (a->n && send_bytes(c, a->bytes, a->n) != 0) return 5;
    zt_sleep_ms(a->hold_ms > 0 ? a->hold_ms : 100);
    close(c);
    return 0;
}

static void expect_client_rejects_held(const unsigned char *bytes, size_t n, int hold_ms,
                                       int timeout_ms, zero_result want, const char *says,
                                       double max_ms);

static void expect_client_rejects(const unsigned char *bytes, size_t n, zero_result want,
                                  const char *says)
{
    expect_client_rejects_held(bytes, n, 0, 3000, want, says, 2500);
}

/* The fake rank 0 answers 'bytes' and keeps the connection open hold_ms; the client (with
   timeout_ms) must return 'want' within max_ms, saying 'says'. */
static void expect_client_rejects_held(const unsigned char *bytes, size_t n, int hold_ms,
                                       int timeout_ms, zero_result want, const char *says,
                                       double max_ms)
{
    fake_server_arg a;
    pid_t pid;
    int code, port = 0;
    unsigned char id[ID_BYTES];
    zero_bootstrap_desc d;
    double t0, dt;
    zero_result r;
    memset(&a, 0, sizeof a);
    a.fd = raw_listener(&port);
    ZT_CHECK(a.fd >= 0);
    if (a.fd < 0) return;
    memcpy(a.bytes, bytes, n);
    a.n = n;
    a.hold_ms = hold_ms;
    pid = spawn(fake_server, &a);
    close(a.fd);
    d = make_desc(1, 2, port, timeout_ms);
    memset(id, 0xee, sizeof id);
    t0 = zt_now_ms();
    r = zero_bootstrap_exchange(&d, id, sizeof id);
    dt = zt_now_ms() - t0;
    ZT_CHECKF(r == want, "got %s, wanted %s (%s)", zero_result_string(r), zero_result_string(want),
              zero_last_error());
    ZT_CHECKF(contains(zero_last_error(), says), "message lacks \"%s\": %s", says, zero_last_error());
    ZT_CHECKF(dt < max_ms, "took %.0f ms (at most %.0f)", dt, max_ms);
    ZT_CHECK(id[0] == 0xee && id[ID_BYTES - 1] == 0xee); /* untouched */
    ZT_CHECK(reap(&pid, 1, 10000, &code) == 0);
}

ZT_TEST(malformed_from_server)
{
    unsigned char m[32 + ID_BYTES + 64], payload[ID_BYTES];
    const char *text = "rank 0 says: world sizes differ";
    memset(payload, 0x42, sizeof payload);
    memset(m, 0xcd, sizeof m);
    expect_client_rejects(m, 32, ZERO_ERROR_COMM, "magic");
    header(m, MAGIC, 2, T_ID, 2, 0, ID_BYTES, ID_BYTES, fnv1a(payload, ID_BYTES), 0);
    expect_client_rejects(m, 32, ZERO_ERROR_COMM, "protocol");
    header(m, MAGIC, 1, T_ID, 5, 0, ID_BYTES, ID_BYTES, fnv1a(payload, ID_BYTES), 0);
    expect_client_rejects(m, 32, ZERO_ERROR_MISMATCH, "world size");
    header(m, MAGIC, 1, T_ID, 2, 0, ID_BYTES, 64, fnv1a(payload, 64), 0); /* wrong size */
    memcpy(m + 32, payload, 64);
    expect_client_rejects(m, 32 + 64, ZERO_ERROR_COMM, "64 payload bytes");
    header(m, MAGIC, 1, T_ID, 2, 0, ID_BYTES, ID_BYTES, fnv1a(payload, ID_BYTES) ^ 1u, 0);
    memcpy(m + 32, payload, ID_BYTES);
    expect_client_rejects(m, 32 + ID_BYTES, ZERO_ERROR_COMM, "checksum");
    header(m, MAGIC, 1, T_HELLO, 2, 0, ID_BYTES, 0, fnv1a(NULL, 0), 0);
    expect_client_rejects(m, 32, ZERO_ERROR_COMM, "hello message");
    header(m, MAGIC, 1, T_ID, 2, 0, ID_BYTES, ID_BYTES, fnv1a(payload, ID_BYTES), 0);
    memcpy(m + 32, payload, 40); /* the id cut short */
    expect_client_rejects(m, 32 + 40, ZERO_ERROR_COMM, "40 of 128 id bytes");
    expect_client_rejects(m, 10, ZERO_ERROR_COMM, "middle of a message");
    header(m, MAGIC, 1, T_ERROR, 2, 0, ID_BYTES, (unsigned)strlen(text),
           fnv1a(text, strlen(text)), (int)ZERO_ERROR_MISMATCH);
    memcpy(m + 32, text, strlen(text));
    expect_client_rejects(m, 32 + strlen(text), ZERO_ERROR_MISMATCH, "world sizes differ");
    header(m, MAGIC, 1, T_ERROR, 2, 0, ID_BYTES, 5000, 0, (int)ZERO_ERROR_MISMATCH);
    expect_client_rejects(m, 32, ZERO_ERROR_COMM, "5000 bytes of text");
}

/* The same rank twice: the second claim fails on both sides with MISMATCH, and rank 0
   tells the late claimant why. */
ZT_TEST(rank_claimed_twice)
{
    client_arg a;
    pid_t pid;
    int code;
    unsigned char id[ID_BYTES];
    zero_bootstrap_desc d0 = make_desc(0, 3, 0, 5000);
    zero_bootstrap_server *s = NULL;
    zero_result r;
    ZT_CHECK(zero_bootstrap_listen(&d0, &s) == ZERO_OK);
    if (!s) return;
    random_id(id, sizeof id, 11);
    a.desc = make_desc(1, 3, zero_bootstrap_server_port(s), 5000);
    memcpy(a.expect, id, ID_BYTES);
    a.want = ZERO_ERROR_MISMATCH;
    a.repeat = 2; /* OK, then MISMATCH */
    pid = spawn(client_child, &a);
    r = zero_bootstrap_serve(s, id, sizeof id);
    zero_bootstrap_server_close(s);
    ZT_CHECKF(r == ZERO_ERROR_MISMATCH, "%s", zero_result_string(r));
    ZT_CHECKF(contains(zero_last_error(), "same rank"), "%s", zero_last_error());
    ZT_CHECK(reap(&pid, 1, 10000, &code) == 0);
}

/* A connection that closes without a word, and one that sends half a header and stalls,
   do not stop the real peers from being served. */
static int stray_child(void *p)
{
    int port = *(int *)p, fd;
    fd = raw_connect(port);
    if (fd < 0) return 3;
    close(fd);
    fd = raw_connect(port);
    if (fd < 0) return 4;
    if (send_bytes(fd, "ZER", 3) != 0) return 5;
    zt_sleep_ms(1500); /* longer than the real exchange takes */
    close(fd);
    return 0;
}

ZT_TEST(stray_connections_ignored)
{
    client_arg a[2];
    pid_t pids[3];
    int codes[3], port, r;
    unsigned char id[ID_BYTES];
    zero_bootstrap_desc d0 = make_desc(0, 3, 0, 10000);
    zero_bootstrap_server *s = NULL;
    zero_result res;
    ZT_CHECK(zero_bootstrap_listen(&d0, &s) == ZERO_OK);
    if (!s) return;
    port = zero_bootstrap_server_port(s);
    random_id(id, sizeof id, 13);
    pids[0] = spawn(stray_child, &port);
    zt_sleep_ms(100); /* the strays connect first */
    for (r = 1; r < 3; r++) {
        a[r - 1].desc = make_desc(r, 3, port, 10000);
        memcpy(a[r - 1].expect, id, ID_BYTES);
        a[r - 1].want = ZERO_OK;
        a[r - 1].repeat = 1;
        pids[r] = spawn(client_child, &a[r - 1]);
    }
    res = zero_bootstrap_serve(s, id, sizeof id);
    zero_bootstrap_server_close(s);
    ZT_CHECKF(res == ZERO_OK, "%s: %s", zero_result_string(res), zero_last_error());
    ZT_CHECK(reap(pids, 3, 15000, codes) == 0);
}

/* ---- the most informative reason ---- */

/* Nobody listens on the port: after the deadline the reason is the refusal, naming the
   address, not the timeout of a last attempt made with no time left. */
ZT_TEST(wrong_port_says_connection_refused)
{
    int i, port = free_port();
    for (i = 1; i <= 2; i++) { /* rank 1 by "localhost", rank 2 by 127.0.0.1 */
        unsigned char id[ID_BYTES];
        char where[64];
        zero_bootstrap_desc d = make_desc(i, 3, port, 400);
        double t0 = zt_now_ms(), dt;
        zero_result r = zero_bootstrap_exchange(&d, id, sizeof id);
        dt = zt_now_ms() - t0;
        snprintf(where, sizeof where, ":%d", port);
        ZT_CHECKF(r == ZERO_ERROR_TIMEOUT, "%s", zero_result_string(r));
        ZT_CHECKF(contains(zero_last_error(), "connection refused: nobody is listening on") &&
                      contains(zero_last_error(), where),
                  "%s", zero_last_error());
        ZT_CHECKF(!contains(zero_last_error(), "timed out") &&
                      !contains(zero_last_error(), "before the deadline"),
                  "%s", zero_last_error());
        ZT_CHECKF(dt >= 350 && dt < 2000, "took %.0f ms for a 400 ms deadline", dt);
    }
}

/* A port answering another protocol with fewer than 32 bytes, then silence: the client
   fails at once (COMM) and shows what it got; bytes that start like the protocol and then
   stop are a timeout that says how many arrived. */
ZT_TEST(other_protocol_fails_fast)
{
    static const char ssh[] = "SSH-2.0-x\r\n";
    unsigned char m[16];
    expect_client_rejects_held((const unsigned char *)ssh, strlen(ssh), 3000, 8000,
                               ZERO_ERROR_COMM, "\"SSH-2.0-x\\r\\n\"", 1500);
    ZT_CHECK(contains(zero_last_error(), "not a zero bootstrap peer"));
    put32(m, MAGIC);
    memset(m + 4, 0, 6);
    expect_client_rejects_held(m, 10, 1500, 400, ZERO_ERROR_TIMEOUT, "sent 10 of 32 header bytes",
                               1400);
    /* and on rank 0's side: a peer that sends a few foreign bytes and waits */
    expect_server_rejects((const unsigned char *)ssh, strlen(ssh), 0, ZERO_ERROR_COMM, "SSH-2.0-x");
}

/* Rank 0's report at its deadline: a peer that received the id and never acknowledged it
   (connection still open) is named as such, not as one that never got the id. */
ZT_TEST(unacknowledged_id_is_reported_as_received)
{
    fake_client_arg a;
    pid_t pid;
    int code;
    unsigned char id[ID_BYTES];
    zero_bootstrap_desc d0 = make_desc(0, 2, 0, 400);
    zero_bootstrap_server *s = NULL;
    zero_result r;
    ZT_CHECK(zero_bootstrap_listen(&d0, &s) == ZERO_OK);
    if (!s) return;
    memset(&a, 0, sizeof a);
    a.port = zero_bootstrap_server_port(s);
    a.read_id_first = 1; /* hello, read the id, then send nothing and wait */
    a.n = 0;
    memset(id, 4, sizeof id);
    pid = spawn(fake_client, &a);
    r = zero_bootstrap_serve(s, id, sizeof id);
    zero_bootstrap_server_close(s);
    ZT_CHECKF(r == ZERO_ERROR_TIMEOUT, "%s", zero_result_string(r));
    ZT_CHECKF(contains(zero_last_error(), "rank(s) 1 received the id but never acknowledged it"),
              "%s", zero_last_error());
    ZT_CHECKF(!contains(zero_last_error(), "never got the id"), "%s", zero_last_error());
    ZT_CHECK(reap(&pid, 1, 10000, &code) == 0);
}

/* ---- the listening address ---- */

/* 1 when a TCP connection to ip:port is accepted within a second. */
static int can_connect(const char *ip, int port)
{
    struct sockaddr_in a;
    struct pollfd pfd;
    int fd = socket(AF_INET, SOCK_STREAM, 0), ok = 0, err = 0;
    socklen_t len = sizeof err;
    if (fd < 0) return 0;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((unsigned short)port);
    if (inet_pton(AF_INET, ip, &a.sin_addr) != 1) {
        close(fd);
        return 0;
    }
    (void)fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
        ok = 1;
    } else if (errno == EINPROGRESS) {
        pfd.fd = fd;
        pfd.events = POLLOUT;
        pfd.revents = 0;
        ok = poll(&pfd, 1, 1000) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 &&
             err == 0;
    }
    close(fd);
    return ok;
}

/* Listens with desc d and closes again; the address it chose ("" on failure) in out. */
static zero_result listen_as(zero_bootstrap_desc d, char *out, size_t size)
{
    zero_bootstrap_server *s = NULL;
    zero_result r = zero_bootstrap_listen(&d, &s);
    out[0] = '\0';
    if (r == ZERO_OK) snprintf(out, size, "%s", zero_bootstrap_server_addr(s));
    zero_bootstrap_server_close(s);
    return r;
}

ZT_TEST(listener_address)
{
    zero_bootstrap_desc d = make_desc(0, 2, 0, 1000);
    zero_bootstrap_server *s = NULL;
    char got[80];
    int aliases;
    /* every interface: 127.0.0.2 reaches it too (Linux routes 127/8 to lo) */
    snprintf(d.bind_addr, sizeof d.bind_addr, "*");
    ZT_CHECK(zero_bootstrap_listen(&d, &s) == ZERO_OK && s);
    if (!s) return;
    ZT_CHECK(strcmp(zero_bootstrap_server_addr(s), "*") == 0);
    aliases = can_connect("127.0.0.2", zero_bootstrap_server_port(s));
    ZT_CHECK(can_connect("127.0.0.1", zero_bootstrap_server_port(s)));
    zero_bootstrap_server_close(s);
    /* the default with a numeric local address (MASTER_ADDR=127.0.0.1): that address only */
    d.bind_addr[0] = '\0';
    ZT_CHECK(zero_bootstrap_listen(&d, &s) == ZERO_OK && s);
    if (!s) return;
    ZT_CHECKF(strcmp(zero_bootstrap_server_addr(s), "127.0.0.1") == 0, "%s",
              zero_bootstrap_server_addr(s));
    ZT_CHECK(can_connect("127.0.0.1", zero_bootstrap_server_port(s)));
    if (aliases) ZT_CHECK(!can_connect("127.0.0.2", zero_bootstrap_server_port(s)));
    zero_bootstrap_server_close(s);
    /* an explicit address */
    snprintf(d.bind_addr, sizeof d.bind_addr, "127.0.0.2");
    ZT_CHECK(zero_bootstrap_listen(&d, &s) == ZERO_OK && s);
    if (!s) return;
    ZT_CHECK(strcmp(zero_bootstrap_server_addr(s), "127.0.0.2") == 0);
    if (aliases) ZT_CHECK(!can_connect("127.0.0.1", zero_bootstrap_server_port(s)));
    zero_bootstrap_server_close(s);
    /* a host name that resolves to loopback is trusted only when every rank is local */
    d.bind_addr[0] = '\0';
    snprintf(d.addr, sizeof d.addr, "%s", g_name);
    d.local_world = -1;
    ZT_CHECK(listen_as(d, got, sizeof got) == ZERO_OK);
    if (strcmp(g_name, "localhost") == 0) ZT_CHECKF(strcmp(got, "*") == 0, "%s", got);
    d.local_world = d.world;
    ZT_CHECK(listen_as(d, got, sizeof got) == ZERO_OK);
    ZT_CHECKF(strcmp(got, "*") != 0 && got[0] != '\0', "%s", got);
    /* rank 0's address is not one of this host's: every interface */
    snprintf(d.addr, sizeof d.addr, "192.0.2.1"); /* TEST-NET-1 */
    ZT_CHECK(listen_as(d, got, sizeof got) == ZERO_OK);
    ZT_CHECKF(strcmp(got, "*") == 0, "%s", got);
    /* an explicit address that is not this host's, or that does not resolve: IO, saying so */
    snprintf(d.bind_addr, sizeof d.bind_addr, "192.0.2.1");
    ZT_CHECK(zero_bootstrap_listen(&d, &s) == ZERO_ERROR_IO && s == NULL);
    ZT_CHECKF(contains(zero_last_error(), "not an address of this host"), "%s", zero_last_error());
    snprintf(d.bind_addr, sizeof d.bind_addr, "no-such-host.invalid");
    ZT_CHECK(zero_bootstrap_listen(&d, &s) == ZERO_ERROR_IO && s == NULL);
    ZT_CHECKF(contains(zero_last_error(), "cannot resolve"), "%s", zero_last_error());
    ZT_CHECK(strcmp(zero_bootstrap_server_addr(NULL), "") == 0);
}

ZT_TEST(env_bind)
{
    zero_bootstrap_desc d;
    ZT_CHECK(env_of(&d, "RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=10.1.2.3", "ZERO_BOOTSTRAP_BIND=*", N_,
                    N_, N_, N_) == ZERO_OK);
    ZT_CHECK(strcmp(d.bind_addr, "*") == 0);
    ZT_CHECK(env_of(&d, "RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=10.1.2.3", N_, N_, N_, N_, N_) ==
             ZERO_OK);
    ZT_CHECK(d.bind_addr[0] == '\0'); /* the default */
    ZT_CHECK(env_of(&d, "RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=10.1.2.3", "ZERO_BOOTSTRAP_BIND=",
                    N_, N_, N_, N_) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(contains(zero_last_error(), "ZERO_BOOTSTRAP_BIND"));
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN); /* the fake peers write to sockets rank 0 may have closed */
    pick_name();
    ZT_RUN(env_none);
    ZT_RUN(env_torchrun);
    ZT_RUN(env_openmpi);
    ZT_RUN(env_slurm);
    ZT_RUN(env_precedence);
    ZT_RUN(env_errors);
    ZT_RUN(env_process);
    ZT_RUN(exchange_arguments);
    ZT_RUN(exchange_2_to_8_processes);
    ZT_RUN(exchange_rank0_late);
    ZT_RUN(port_in_use);
    ZT_RUN(peer_never_arrives);
    ZT_RUN(rank0_never_comes);
    ZT_RUN(malformed_from_client);
    ZT_RUN(malformed_from_server);
    ZT_RUN(rank_claimed_twice);
    ZT_RUN(stray_connections_ignored);
    ZT_RUN(wrong_port_says_connection_refused);
    ZT_RUN(other_protocol_fails_fast);
    ZT_RUN(unacknowledged_id_is_reported_as_received);
    ZT_RUN(listener_address);
    ZT_RUN(env_bind);
    return zt_summary();
}
