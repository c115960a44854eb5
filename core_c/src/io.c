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
    pthread_t *readers;         /* their handles */
};

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
    return h && (!h->background || io->n_readers < 2 || (io->running_background == 0 && io->running_urgent == 0));
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
        if (takeable(io)) pthread_cond_signal(&io->work); /* more pieces: another reader */
        pthread_mutex_unlock(&io->mu);
        int err_no = read_piece(job, from, len, &got);
        pthread_mutex_lock(&io->mu);
        io->running_background -= background;
        io->running_urgent -= urgent;
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
            job->crc = fe_crc32(0, job->buf + job->crc_from, job->crc_len);
            pthread_mutex_lock(&io->mu);
        }
        job->seconds = fe_now() - job->started;
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
    pthread_mutex_lock(&io->mu);
    if (urgent > 0) { /* after the urgent ones already queued, before the rest */
        link_urgent(io, job);
    } else {
        if (io->tail) io->tail->next = job;
        else io->head = job;
        io->tail = job;
    }
    pthread_cond_signal(&io->work);
    pthread_mutex_unlock(&io->mu);
}

void fe_io_promote(fe_io *io, fe_io_job *job) {
    pthread_mutex_lock(&io->mu);
    fe_io_job *prev = NULL;
    for (fe_io_job *j = io->head; j; prev = j, j = j->next) {
        if (j != job) continue;
        if (j->urgent) break;
        if (j->claimed) { /* being read, so at the queue's front already: its pieces no longer wait */
            if (j->background) { j->background = 0; pthread_cond_signal(&io->work); }
            break;
        }
        if (prev) prev->next = j->next;
        else io->head = j->next;
        if (io->tail == j) io->tail = prev;
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
