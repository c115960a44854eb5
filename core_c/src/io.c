/* io.c — see io.h. */
#define _GNU_SOURCE
#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct fe_io {
    pthread_mutex_t mu;         /* guards the queue, job->done, completions */
    pthread_cond_t work;        /* a job was queued, or shutdown */
    pthread_cond_t finished;    /* a job completed */
    fe_io_job *head, *tail;     /* pending jobs: urgent ones first, each kind in FIFO order */
    fe_io_job *last_urgent;     /* the last urgent job in the queue, or NULL */
    unsigned completions;       /* jobs completed so far (wraps) */
    int shutdown;               /* readers should exit */
    int n_readers;              /* threads started */
    int running_background;     /* background jobs being read now */
    int running_urgent;         /* urgent jobs being read now */
    int running;                /* pieces being read now, at most depth */
    int depth;                  /* pieces read at once (the hill climb's choice, io.h) */
    fe_io_depth climb;          /* its state */
    int waiting;                /* measured jobs (not the fill's) queued or being read */
    double busy_since;          /* when waiting last rose from 0 */
    double busy;                /* seconds of this epoch with waiting > 0, up to busy_since */
    uint64_t epoch_bytes;       /* bytes those pieces brought this epoch */
    int epoch_pieces;           /* and how many there were */
    pthread_t *readers;         /* their handles */
    fe_own_work own;            /* the pieces' reads and CRCs, for the compute pool (pool.h) */
};

const fe_own_work *fe_io_own_work(const fe_io *io) { return &io->own; }

/* Read `len` bytes of `job` from `from` into its buffer; returns 0, an errno,
 * or -1 for a short read, and the bytes read in *got. */
static int read_piece(const fe_io_job *job, uint64_t from, uint64_t len, uint64_t *got) {
    uint64_t done = 0;
    while (done < len) {
        ssize_t r = pread(job->fd, job->buf + from + done, len - done, (off_t)(job->offset + from + done));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) { *got = done; return errno; }
        if (r == 0) { *got = done; return -1; }
        done += (uint64_t)r;
    }
    *got = done;
    return 0;
}

/* Take the next piece of the head job (io->mu held): the job leaves the
 * queue once its last piece is taken. */
static fe_io_job *take_piece(fe_io *io, uint64_t *from, uint64_t *len) {
    fe_io_job *job = io->head;
    if (job->claimed == 0) job->started = fe_now();
    *from = job->claimed;
    uint64_t left = job->size - job->claimed;
    /* one reader: whole jobs (one read of a record lets the kernel queue all of it at once) */
    *len = left < FE_IO_CHUNK || io->n_readers == 1 ? left : FE_IO_CHUNK;
    job->claimed += *len;
    job->inflight++;
    if (job->claimed >= job->size) {
        io->head = job->next;
        if (!io->head) io->tail = NULL;
        if (io->last_urgent == job) io->last_urgent = NULL;
    }
    return job;
}

/* May a reader start the queue's head now (io->mu held)? A background job
 * only when no other one and no urgent job is being read: the fill is one
 * sequential stream that gives the disk to any read the compute waits for
 * (with one reader, it just runs). */
static int takeable(const fe_io *io) {
    const fe_io_job *h = io->head;
    return h && io->running < (h->size > FE_IO_CHUNK ? io->n_readers : io->depth) && (!h->background || io->n_readers < 2 || (io->running_background == 0 && io->running_urgent == 0));
}

void fe_io_depth_init(fe_io_depth *d, int n_readers) {
    memset(d, 0, sizeof *d);
    if (n_readers < 1) n_readers = 1;
    for (int q = 1; q < n_readers && d->n < FE_IO_MAX_LEVELS - 1; q *= 2) d->level[d->n++] = q;
    d->level[d->n++] = n_readers;
    d->at = d->n - 1;
    d->probing = -1;
}

/* Of the depths with indices lo < hi, measured both: the deeper only when it gives FE_IO_DEEPER_GAIN times the rate. */
static int better(const fe_io_depth *d, int lo, int hi) {
    return d->rate[hi] >= FE_IO_DEEPER_GAIN * d->rate[lo] ? hi : lo;
}

int fe_io_depth_step(fe_io_depth *d, double rate) {
    const int i = d->at;
    if (rate > 0.0) d->rate[i] = d->rate[i] > 0.0 ? 0.5 * d->rate[i] + 0.5 * rate : rate;
    if (d->probing >= 0) { /* a neighbour was tried for an epoch: keep the better of the two */
        const int from = d->probing;
        d->probing = -1;
        d->at = i < from ? better(d, i, from) : better(d, from, i);
        d->stay = 0;
        return d->level[d->at];
    }
    d->stay++;
    const int down = i - 1, up = i + 1;
    int to = i;
    if (down >= 0 && d->rate[down] == 0.0) { /* not measured yet: try it */
        d->probing = i;
        to = down;
    } else if (down >= 0 && better(d, down, i) == down) {
        to = down;
    } else if (up < d->n && d->rate[up] > 0.0 && better(d, i, up) == up) {
        to = up;
    } else if (d->stay >= FE_IO_PROBE && d->n > 1) { /* refresh a neighbour's rate */
        to = (d->probe_up && up < d->n) || down < 0 ? up : down;
        d->probe_up = !d->probe_up;
        d->probing = i;
    }
    if (to != i) d->stay = 0;
    d->at = to;
    return d->level[d->at];
}

int fe_io_queue_depth(fe_io *io) {
    pthread_mutex_lock(&io->mu);
    int q = io->depth;
    pthread_mutex_unlock(&io->mu);
    return q;
}

/* The measured rate is bytes over the time some measured job was waiting
 * for the disk (queued or being read), not only the time a read was in
 * flight: a shallow queue also pays for the gaps in which a reader waits for
 * a core to issue its next read. The fill's jobs are not measured (one at a
 * time whatever the depth) unless a visit promotes one. (io->mu held) */
static void work_add(fe_io *io, fe_io_job *job) {
    if (job->size > FE_IO_CHUNK) return; /* several pieces: read at every reader's depth (io.h) */
    job->measured = 1;
    if (io->waiting++ == 0) io->busy_since = fe_now();
}

static void work_done(fe_io *io, fe_io_job *job) {
    if (!job->measured) return;
    job->measured = 0;
    if (--io->waiting == 0) io->busy += fe_now() - io->busy_since;
}

/* A piece of a measured job brought `got` bytes: at the end of an epoch, one step of the climb. */
static void measure_piece(fe_io *io, uint64_t got) {
    io->epoch_bytes += got;
    if (++io->epoch_pieces < FE_IO_EPOCH) return;
    const double now = fe_now();
    double busy = io->busy;
    if (io->waiting > 0) { /* still busy: count up to now, go on from now */
        busy += now - io->busy_since;
        io->busy_since = now;
    }
    const int was = io->depth;
    io->depth = fe_io_depth_step(&io->climb, busy > 0.0 ? (double)io->epoch_bytes / busy : 0.0);
    io->busy = 0.0;
    io->epoch_bytes = 0;
    io->epoch_pieces = 0;
    if (io->depth > was) pthread_cond_broadcast(&io->work); /* readers may start more pieces */
}

static void *reader_main(void *arg) {
    fe_io *io = arg;
    pthread_mutex_lock(&io->mu);
    while (1) {
        while (!io->shutdown && !takeable(io)) pthread_cond_wait(&io->work, &io->mu);
        if (io->shutdown && !io->head) break;
        uint64_t from, len, got = 0;
        fe_io_job *job = take_piece(io, &from, &len);
        /* counted per piece: a background job is read one piece at a time, as one stream */
        const int background = job->background, urgent = job->urgent;
        io->running_background += background;
        io->running_urgent += urgent;
        io->running++;
        if (takeable(io)) pthread_cond_signal(&io->work); /* more pieces: another reader */
        pthread_mutex_unlock(&io->mu);
        const long long own0 = fe_own_work_begin(&io->own);
        int err_no = read_piece(job, from, len, &got);
        fe_own_work_end(&io->own, own0);
        pthread_mutex_lock(&io->mu);
        io->running_background -= background;
        io->running_urgent -= urgent;
        io->running--;
        if (job->measured) measure_piece(io, got);
        /* A background job held back while this piece ran may start now: one
         * reader is woken for it (a broadcast here woke every idle reader on
         * every completion, to find nothing to do: on two cores those
         * wake-ups took the compute threads' time). */
        if ((background || urgent) && takeable(io)) pthread_cond_signal(&io->work);
        job->got += got;
        if (err_no && !job->err_no) job->err_no = err_no;
        job->inflight--;
        if (job->claimed < job->size || job->inflight > 0) continue; /* other pieces still out */
        /* the last piece: no other reader touches the job now */
        if (!job->err_no && job->crc_len && job->crc_from + job->crc_len <= job->got) {
            pthread_mutex_unlock(&io->mu);
            const long long crc0 = fe_own_work_begin(&io->own);
            job->crc = fe_crc32(0, job->buf + job->crc_from, job->crc_len);
            fe_own_work_end(&io->own, crc0);
            pthread_mutex_lock(&io->mu);
        }
        job->seconds = fe_now() - job->started;
        work_done(io, job);
        job->done = 1;
        io->completions++;
        pthread_cond_broadcast(&io->finished);
    }
    pthread_mutex_unlock(&io->mu);
    return NULL;
}

fe_io *fe_io_new(int n_readers) {
    fe_io *io = calloc(1, sizeof *io);
    if (!io) return NULL;
    pthread_mutex_init(&io->mu, NULL);
    pthread_cond_init(&io->work, NULL);
    pthread_cond_init(&io->finished, NULL);
    io->readers = calloc((size_t)(n_readers > 0 ? n_readers : 1), sizeof *io->readers);
    if (!io->readers) { fe_io_free(io); return NULL; }
    for (int i = 0; i < n_readers; i++) {
        if (pthread_create(&io->readers[i], NULL, reader_main, io) != 0) break;
        io->n_readers++;
    }
    if (io->n_readers == 0) { fe_io_free(io); return NULL; }
    pthread_mutex_lock(&io->mu);
    fe_io_depth_init(&io->climb, io->n_readers);
    io->depth = io->n_readers;
    pthread_mutex_unlock(&io->mu);
    return io;
}

void fe_io_free(fe_io *io) {
    if (!io) return;
    pthread_mutex_lock(&io->mu);
    io->shutdown = 1;
    pthread_cond_broadcast(&io->work);
    pthread_mutex_unlock(&io->mu);
    for (int i = 0; i < io->n_readers; i++) pthread_join(io->readers[i], NULL);
    pthread_mutex_destroy(&io->mu);
    pthread_cond_destroy(&io->work);
    pthread_cond_destroy(&io->finished);
    free(io->readers);
    free(io);
}

/* Put a job into the urgent part of the queue (io->mu held). */
static void link_urgent(fe_io *io, fe_io_job *job) {
    job->urgent = 1;
    job->background = 0;
    fe_io_job **at = io->last_urgent ? &io->last_urgent->next : &io->head;
    job->next = *at;
    *at = job;
    if (!job->next) io->tail = job;
    io->last_urgent = job;
}

void fe_io_submit(fe_io *io, fe_io_job *job, int urgent) {
    job->done = 0;
    job->err_no = 0;
    job->got = 0;
    job->next = NULL;
    job->urgent = 0;
    job->claimed = 0;
    job->inflight = 0;
    job->seconds = 0.0;
    job->background = urgent == FE_IO_BACKGROUND;
    job->measured = 0;
    pthread_mutex_lock(&io->mu);
    if (!job->background) work_add(io, job);
    if (urgent > 0) { /* after the urgent ones already queued, before the rest */
        link_urgent(io, job);
    } else {
        if (io->tail) io->tail->next = job;
        else io->head = job;
        io->tail = job;
    }
    /* Not when the depth is reached: a reader that finishes its piece takes the next itself. */
    if (takeable(io)) pthread_cond_signal(&io->work);
    pthread_mutex_unlock(&io->mu);
}

void fe_io_promote(fe_io *io, fe_io_job *job) {
    pthread_mutex_lock(&io->mu);
    fe_io_job *prev = NULL;
    for (fe_io_job *j = io->head; j; prev = j, j = j->next) {
        if (j != job) continue;
        if (j->urgent) break;
        if (j->claimed) { /* being read, so at the queue's front already: its pieces no longer wait */
            if (j->background) { j->background = 0; work_add(io, j); pthread_cond_signal(&io->work); }
            break;
        }
        if (prev) prev->next = j->next;
        else io->head = j->next;
        if (io->tail == j) io->tail = prev;
        if (!j->measured) work_add(io, j);
        link_urgent(io, j);
        pthread_cond_signal(&io->work); /* a reader may be held back by the background limit */
        break;
    }
    pthread_mutex_unlock(&io->mu);
}

int fe_io_cancel(fe_io *io, fe_io_job *job) {
    pthread_mutex_lock(&io->mu);
    fe_io_job *prev = NULL;
    int taken = 0;
    for (fe_io_job *j = io->head; j; prev = j, j = j->next) {
        if (j != job) continue;
        if (j->claimed) break; /* being read: wait for it */
        if (prev) prev->next = j->next;
        else io->head = j->next;
        if (io->tail == j) io->tail = prev;
        if (io->last_urgent == j) io->last_urgent = j->urgent && prev && prev->urgent ? prev : NULL;
        work_done(io, j);
        taken = 1;
        break;
    }
    pthread_mutex_unlock(&io->mu);
    return taken;
}

void fe_io_wait(fe_io *io, fe_io_job *job) {
    pthread_mutex_lock(&io->mu);
    while (!job->done) pthread_cond_wait(&io->finished, &io->mu);
    pthread_mutex_unlock(&io->mu);
}

int fe_io_is_done(fe_io *io, fe_io_job *job) {
    pthread_mutex_lock(&io->mu);
    int d = job->done;
    pthread_mutex_unlock(&io->mu);
    return d;
}

unsigned fe_io_completions(fe_io *io) {
    pthread_mutex_lock(&io->mu);
    unsigned n = io->completions;
    pthread_mutex_unlock(&io->mu);
    return n;
}

void fe_io_wait_any(fe_io *io, unsigned *seen) {
    pthread_mutex_lock(&io->mu);
    while (io->completions == *seen) pthread_cond_wait(&io->finished, &io->mu);
    *seen = io->completions;
    pthread_mutex_unlock(&io->mu);
}

int fe_io_open_records(const char *path, uint64_t probe_offset, uint64_t probe_size, int want_direct,
                       int *direct, char *why, size_t why_len) {
    *direct = 0;
    why[0] = '\0';
    if (want_direct) {
#if defined(__linux__) && defined(O_DIRECT)
        int fd = open(path, O_RDONLY | O_DIRECT | O_NONBLOCK);
        if (fd >= 0) {
            void *buf = NULL;
            if (posix_memalign(&buf, 4096, probe_size) == 0) {
                ssize_t r = pread(fd, buf, probe_size, (off_t)probe_offset);
                free(buf);
                if (r == (ssize_t)probe_size) { *direct = 1; return fd; }
                snprintf(why, why_len, "an O_DIRECT read failed (%s)", r < 0 ? strerror(errno) : "short read");
            }
            close(fd);
        } else {
            snprintf(why, why_len, "the filesystem refused O_DIRECT (%s)", strerror(errno));
        }
#elif defined(__APPLE__)
        int fd = open(path, O_RDONLY | O_NONBLOCK);
        if (fd >= 0 && fcntl(fd, F_NOCACHE, 1) == 0) { *direct = 1; return fd; }
        if (fd >= 0) close(fd);
        snprintf(why, why_len, "F_NOCACHE was refused (%s)", strerror(errno));
#else
        snprintf(why, why_len, "direct I/O is not available on this system");
#endif
    } else {
        snprintf(why, why_len, "direct I/O was switched off");
    }
    return open(path, O_RDONLY | O_NONBLOCK);
}
